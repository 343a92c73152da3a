"""What a sweep returns (kept apart from the driver so `import rayparallel` stays light)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SweepResult:
    """What `rayparallel.tune` returns; `trials` are the rows of `tune_results.csv`."""

    output_dir: str
    metric: str
    mode: str
    trials: list[dict]
    best_trial: str | None
    best_value: float | None
    best_weights: str | None  # the best trial's final weights: `rayparallel export` takes it as it is
    results_csv: str
    mlflow: dict = field(default_factory=dict)  # the parent run: run_id, url, experiment
