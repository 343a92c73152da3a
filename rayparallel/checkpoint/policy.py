"""Which checkpoints to write, what to call them and which to keep: Keras' ModelCheckpoint rules.

Pure logic: the driver checks the template before training, the workers decide each save
(:class:`SaveDecision`), the recorder keeps the files `keep` allows (:class:`Retention`).
"""

from __future__ import annotations

import math
import string
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..errors import SpecError
from ..spec import CheckpointSpec

POSITION_FIELDS = ("epoch", "step", "batch")
FINAL = "final.weights.h5"  # the weights at the end of training, beside the template's files
_MAX_HINTS = ("acc", "auc", "iou", "precision", "recall", "f1", "fmeasure")


def resolve_mode(monitor: str, mode: str) -> str:
    """`auto` means max for accuracy-like figures, min otherwise (as Keras decides)."""
    if mode != "auto":
        return mode
    return "max" if any(hint in monitor.lower() for hint in _MAX_HINTS) else "min"


def template_fields(filepath: str) -> list[str]:
    try:
        return [name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(filepath) if name]
    except ValueError as exc:
        raise SpecError(
            f"checkpoint.filepath: expected a Python format template, received {filepath!r} ({exc})"
        ) from None


def check_against_metrics(spec: CheckpointSpec, epoch_keys: Iterable[str], step_keys: Iterable[str]) -> None:
    """Every template field and the monitor must be figures the job produces when it saves."""
    available = set(step_keys) if isinstance(spec.save_freq, int) else set(epoch_keys)
    allowed = sorted(available | set(POSITION_FIELDS))
    when = f"every {spec.save_freq} steps" if isinstance(spec.save_freq, int) else "at epoch end"
    for name in template_fields(spec.filepath):
        if name not in allowed:
            raise SpecError(
                f"checkpoint.filepath: expected fields among {allowed} (figures {when}), received {{{name}}}"
            )
    needs_monitor = spec.save_best_only or spec.keep is not None
    if needs_monitor and spec.monitor not in available:
        raise SpecError(
            f"checkpoint.monitor: expected one of {sorted(available)} (figures {when}), received {spec.monitor!r}"
        )


@dataclass(frozen=True)
class Saved:
    """One save: the file it is written to, where in training, and the figures then.

    The worker decides on it (:class:`SaveDecision`) and hands it over as one value; the
    manifest records it as it came.
    """

    file: str
    epoch: int
    step: int
    logs: dict

    def score(self, monitor: str) -> float | None:
        value = self.logs.get(monitor)
        return None if value is None or math.isnan(value) else float(value)


@dataclass
class _Monitored:
    """What the decision and the retention share: the monitored figure and its direction."""

    spec: CheckpointSpec

    @property
    def mode(self) -> str:
        return resolve_mode(self.spec.monitor, self.spec.mode)

    def _sign(self) -> int:
        return 1 if self.mode == "min" else -1


@dataclass
class SaveDecision(_Monitored):
    """Whether to save now and under which name: decided on every rank alike, from global logs.

    This is the only place that decides; the recorder writes what it is handed.
    """

    best: float | None = None  # the monitor's best among saved files (kept by the recorder over restarts)

    def to_save(self, epoch: int, step: int, batch: int, logs: dict) -> Saved | None:
        """The save for this moment, or None (checkpoints off, or not an improvement)."""
        if not self.spec.enabled or (self.spec.save_best_only and not self._improves(logs)):
            return None
        if self._improves(logs):
            self.best = float(logs[self.spec.monitor])
        name = self.spec.filepath.format(epoch=epoch, step=step, batch=batch, **logs)
        return Saved(file=name, epoch=epoch, step=step, logs=dict(logs))

    def _improves(self, logs: dict) -> bool:
        value = logs.get(self.spec.monitor)
        if value is None or math.isnan(value):
            return False
        return self.best is None or self._sign() * value < self._sign() * self.best


@dataclass
class Retention(_Monitored):
    """Which written files stay: `keep` best by the monitor, plus the latest (the recorder's side)."""

    saved: list[Saved] = field(default_factory=list)

    def record(self, entry: Saved) -> list[Saved]:
        """Add a written file; return the entries `keep` says to delete (never the new one)."""
        self.saved = [s for s in self.saved if s.file != entry.file] + [entry]
        if self.spec.keep is None:
            return []
        ranked = sorted(self._scored(), key=lambda s: self._sign() * s.score(self.spec.monitor))
        keep = {id(s) for s in ranked[: self.spec.keep]} | {id(entry)}
        dropped = [s for s in self.saved if id(s) not in keep]
        self.saved = [s for s in self.saved if id(s) in keep]
        return dropped

    def best_entry(self) -> Saved | None:
        scored = self._scored()
        return min(scored, key=lambda s: self._sign() * s.score(self.spec.monitor)) if scored else None

    def best_value(self) -> float | None:
        best = self.best_entry()
        return best.score(self.spec.monitor) if best else None

    def _scored(self) -> list[Saved]:
        return [s for s in self.saved if s.score(self.spec.monitor) is not None]


def files_kept(spec: CheckpointSpec, epochs: int, steps_per_epoch: int) -> int:
    """How many weight files the folder holds at most by the end: the saves `save_freq` makes,
    as many as `keep` keeps (the best k plus the latest), and the final weights."""
    if "{" not in spec.filepath:  # one name, written over each time
        return 2
    saves = epochs if spec.save_freq == "epoch" else epochs * steps_per_epoch // spec.save_freq
    return (saves if spec.keep is None else min(saves, spec.keep + 1)) + 1
