"""What a training run returns and writes as `result.json`."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class WorkerInfo:
    """What a rank tells the recorder of itself as its worker group starts (and, at the end, its
    final weights' digest, memory and input waits): a row of `result.json`'s `workers`."""

    rank: int
    world: int  # its worker group's size
    node_id: str
    pid: int
    gpu_ids: list[str]
    batch_shape: list[list]  # each model input's shape, batch first
    resumed_from_epoch: int  # epochs done before this group started
    resumed_from_step: int  # steps into the next epoch
    global_step: int
    memory: dict  # MB of PSS: before the data, at its peak, in Ray's object store (worker.memory)
    final_weights_sha256: str | None = None  # the end: replicas in step hold the same weights
    epoch_start_wait_s: list[float] = field(default_factory=list)  # the end: each epoch's wait for its first batch


@dataclass(frozen=True)
class RunSummary:
    """What the recorder knows of a run at its end, for the driver's `TrainResult`."""

    history: list[dict]
    final_weights: str | None
    checkpoint_dir: str
    checkpoints: list[str]
    workers: list[WorkerInfo]  # the last group's, by rank
    first_step_at: float | None
    startup_marks: dict[str, float]  # phase -> unix time, the first time rank 0 reached it
    resizes: list[dict]
    stopped: dict | None


@dataclass
class TrainResult:
    """Per-epoch global figures (Keras' history keys), final base weights, worker placement."""

    name: str
    history: list[dict]
    final_weights: str
    workers: list[dict]
    output_dir: str
    seconds: float  # from the command's start to the end, the clock of `startup`
    checkpoint_dir: str = ""
    checkpoints: list[str] = field(default_factory=list)
    baselines: dict = field(default_factory=dict)
    mlflow: dict = field(default_factory=dict)  # run_id, url, tracking_uri; `unlogged` if any
    first_step_at: float | None = None  # unix time rank 0 finished its first step
    time_to_first_step_s: float | None = None  # from the command's start to that step
    startup: dict = field(default_factory=dict)  # phase -> seconds since the command started (rayparallel.startup)
    resizes: list[dict] = field(default_factory=list)  # elastic runs: when, from, to, at which epoch and step
    stopped: dict | None = None  # ended before train.epochs: {"epoch": last epoch run, "reason": why}

    @property
    def final(self) -> dict[str, float]:
        return self.history[-1] if self.history else {}

    def write(self) -> Path:
        path = Path(self.output_dir) / "result.json"
        path.write_text(json.dumps(asdict(self), indent=2, default=_plain))
        return path


def describe_stop(stopped: dict) -> str:
    """A run's early end as one phrase.

    >>> describe_stop({"epoch": 2, "reason": "EarlyStopping stopped training"})
    'after epoch 2: EarlyStopping stopped training'
    """
    return f"after epoch {stopped['epoch']}: {stopped['reason']}"


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
