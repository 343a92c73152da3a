"""Console progress in the shape Keras users know from `fit(verbose=2)`."""

from __future__ import annotations

import sys
from typing import TextIO


def format_logs(logs: dict) -> str:
    return " - ".join(f"{k}: {v:.4g}" for k, v in logs.items() if k not in ("epoch", "samples_per_s"))


def describe_resize(resize: dict) -> str:
    """One line for a worker group that restarted with another size (see RunRecorder.register_worker)."""
    return (
        f"resized {resize['from']} -> {resize['to']} workers at epoch {resize['epoch']} step {resize['step']} "
        f"(per-worker batch {resize['batch_from']} -> {resize['batch_to']})"
    )


def progress_bar(event: dict, width: int = 20) -> str:
    """The running epoch as Keras' `Progbar` shows it: steps, bar, ETA, time per step, running loss.

    >>> progress_bar({"step": 5, "steps": 20, "seconds": 2.0, "loss": 0.25})
    '5/20 ━━━━━─────────────── 6s 400ms/step - loss: 0.2500'
    """
    step, steps, seconds = event["step"], event["steps"], event.get("seconds") or 0.0
    done = width * step // steps
    bar = "━" * done + "─" * (width - done)
    per_step = seconds / max(step, 1)
    return (
        f"{step}/{steps} {bar} {per_step * (steps - step):.0f}s {per_step * 1000:.0f}ms/step - "
        f"loss: {event['loss']:.4f}"
    )


class ConsoleProgress:
    def __init__(self, epochs: int, stream: TextIO | None = None):
        self.epochs, self.stream = epochs, stream or sys.stdout
        self._live = self.stream.isatty()
        self._epoch_shown = 0

    def show(self, event: dict) -> None:
        if event["kind"] == "warning":
            self._line(("\n" if self._live else "") + f"WARNING {event['text']}")
            return
        if event["kind"] == "checkpoint":  # written later by the actor, so no epoch header
            self._line(("\r" if self._live else "") + f"Epoch {event['epoch']}: saved {event['file']}")
            return
        if event["epoch"] != self._epoch_shown:
            self._epoch_shown = event["epoch"]
            self._line(f"Epoch {event['epoch']}/{self.epochs}")
        if event["kind"] == "progress":
            if self._live:  # a log file gets the epoch's line only
                self.stream.write("\r" + progress_bar(event) + "\x1b[K")
                self.stream.flush()
            return
        logs = event["logs"]
        text = f"{event['seconds']:.1f}s - {format_logs(logs)} - {logs['samples_per_s']:.0f} samples/s"
        self._line(("\r\x1b[K" if self._live else "") + text)

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()
