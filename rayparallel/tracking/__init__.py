"""Tracking: the run's params, metrics, checkpoints and final model in MLflow."""
