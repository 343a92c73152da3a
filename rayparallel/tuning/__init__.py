"""Hyperparameter sweeps: every trial a whole rayparallel run, scheduled by Ray Tune."""
