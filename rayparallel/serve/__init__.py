"""`rayparallel serve`: live stateful streams, each in a batch slot of a replica (issue 50, in progress)."""
