"""What each trial ended with, read back from its own folder, and the sweep's results table."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..cluster.run_state import read_run_state
from .space import Trial


@dataclass
class TrialOutcome:
    trial: Trial
    status: str  # FINISHED, FAILED, KILLED, RUNNING (interrupted) or PENDING (never started): MLflow's words
    history: list[dict]
    best: float | None  # the trial's best value of the sweep's metric over its epochs
    final_weights: str | None
    mlflow_run_id: str | None
    stopped: dict | None  # ended early by the scheduler: {"epoch", "reason"}
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.status == "FINISHED"

    def row(self, metric: str) -> dict:
        return {
            "trial": self.trial.id,
            "status": self.status,
            "epochs": len(self.history),
            "stopped_early": bool(self.stopped),
            f"best_{metric}": self.best,
            "overrides": " ".join(self.trial.overrides),
            "final_weights": self.final_weights or "",
            "mlflow_run_id": self.mlflow_run_id or "",
            "error": self.error or "",
        }


def read_outcome(trial: Trial, folder: Path, metric: str, mode: str, error: str | None = None) -> TrialOutcome:
    """From `run.json` (status) and `result.json` (written when the run finished)."""
    state, result_file = read_run_state(folder), folder / "result.json"
    status = state.status if state else "PENDING"
    if error:  # failed before its run began (a bad value), or its process was lost
        status = "FAILED"
    result = json.loads(result_file.read_text()) if status == "FINISHED" and result_file.is_file() else {}
    history = result.get("history", [])
    values = [logs[metric] for logs in history if isinstance(logs.get(metric), (int, float))]
    values = [v for v in values if not math.isnan(v)]
    best = (min(values) if mode == "min" else max(values)) if values else None
    return TrialOutcome(
        trial=trial,
        status=status,
        history=history,
        best=best,
        final_weights=result.get("final_weights"),
        mlflow_run_id=(result.get("mlflow") or {}).get("run_id"),
        stopped=result.get("stopped"),
        error=error,
    )


def best_outcome(outcomes: list[TrialOutcome], mode: str) -> TrialOutcome | None:
    """The finished trial with the best value (ties: the earlier trial)."""
    scored = [o for o in outcomes if o.finished and o.best is not None]
    if not scored:
        return None
    return (min if mode == "min" else max)(scored, key=lambda o: o.best)


def write_csv(outcomes: list[TrialOutcome], path: Path, metric: str) -> Path:
    rows = [o.row(metric) for o in outcomes]
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)
    return path


def format_table(outcomes: list[TrialOutcome], metric: str, best: TrialOutcome | None) -> str:
    """The console table: one line a trial, the best marked with `*`."""
    header = ("", "trial", "status", "epochs", f"best {metric}", "overrides")
    lines = [header]
    for o in outcomes:
        status = "STOPPED EARLY" if o.stopped else o.status
        value = f"{o.best:.6g}" if o.best is not None else "-"
        lines.append(
            ("*" if o is best else "", o.trial.id, status, str(len(o.history)), value, " ".join(o.trial.overrides))
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line[:-1], widths, strict=True)) + "  " + line[-1]
        for line in lines
    )
