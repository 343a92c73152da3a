"""The run's recorder: one Ray actor per run that keeps its files, figures and MLflow run."""
