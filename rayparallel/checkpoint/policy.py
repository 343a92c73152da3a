"""Which checkpoints to write, what to call them and which to keep: Keras' ModelCheckpoint rules.

Pure logic, shared by the driver (template checks before training) and the checkpoint actor.
"""

from __future__ import annotations

import math
import string
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..errors import SpecError
from ..spec import CheckpointSpec

POSITION_FIELDS = ("epoch", "step", "batch")
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


@dataclass
class Saved:
    """One written checkpoint as the manifest records it."""

    file: str
    epoch: int
    step: int
    metrics: dict

    def score(self, monitor: str) -> float | None:
        value = self.metrics.get(monitor)
        return None if value is None or math.isnan(value) else float(value)


@dataclass
class Policy:
    spec: CheckpointSpec
    saved: list[Saved] = field(default_factory=list)
    best: float | None = None

    @property
    def mode(self) -> str:
        return resolve_mode(self.spec.monitor, self.spec.mode)

    def filename(self, epoch: int, step: int, batch: int, metrics: dict) -> str:
        return self.spec.filepath.format(epoch=epoch, step=step, batch=batch, **metrics)

    def improves(self, metrics: dict) -> bool:
        value = metrics.get(self.spec.monitor)
        if value is None or math.isnan(value):
            return False
        if self.best is None:
            return True
        return value < self.best if self.mode == "min" else value > self.best

    def should_save(self, metrics: dict) -> bool:
        return not self.spec.save_best_only or self.improves(metrics)

    def note(self, metrics: dict) -> None:
        """Remember the monitored value of a saved checkpoint if it is the best so far."""
        if self.improves(metrics):
            self.best = float(metrics[self.spec.monitor])

    def record(self, entry: Saved) -> list[Saved]:
        """Add a written file; return the entries `keep` says to delete (never the new one)."""
        self.note(entry.metrics)
        self.saved = [s for s in self.saved if s.file != entry.file] + [entry]
        if self.spec.keep is None:
            return []
        latest = self.saved[-1]
        sign = 1 if self.mode == "min" else -1
        ranked = sorted(
            (s for s in self.saved if s.score(self.spec.monitor) is not None),
            key=lambda s: sign * s.score(self.spec.monitor),
        )
        keep = {id(s) for s in ranked[: self.spec.keep]} | {id(latest)}
        dropped = [s for s in self.saved if id(s) not in keep]
        self.saved = [s for s in self.saved if id(s) in keep]
        return dropped

    def best_entry(self) -> Saved | None:
        sign = 1 if self.mode == "min" else -1
        scored = [s for s in self.saved if s.score(self.spec.monitor) is not None]
        return min(scored, key=lambda s: sign * s.score(self.spec.monitor)) if scored else None
