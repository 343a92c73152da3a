"""The package version, on the ground floor so that every part can record it."""

__version__ = "0.1.0"
