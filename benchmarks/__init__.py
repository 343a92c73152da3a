"""Benchmarks: print figures measured on this machine (not timed tests)."""
