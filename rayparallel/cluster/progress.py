"""Console progress in the shape Keras users know from `fit(verbose=2)`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from ..logs import THROUGHPUT
from ..recorder.events import CheckpointWritten, EpochEnded, Progress, RunWarning
from ..result import TrainResult, describe_stop
from ..startup import describe

# Figures `result.json` and MLflow keep that Keras' epoch line does not show (samples/s has its own place).
NOT_SHOWN = ("epoch", *THROUGHPUT)
# Workers that waited for data this share of an epoch or more: input holds training back, say so.
INPUT_WAIT_WARNING = 0.10


def format_logs(logs: dict) -> str:
    return " - ".join(f"{k}: {v:.4g}" for k, v in logs.items() if k not in NOT_SHOWN)


def input_warning(epoch: int, logs: dict) -> str | None:
    """One line when the workers waited for input a noticeable share of the epoch, else None."""
    waited = logs.get("input_wait_fraction", 0.0)
    if waited < INPUT_WAIT_WARNING:
        return None
    return f"input: workers waited {waited:.0%} of epoch {epoch} for data; see docs/data.md"


def describe_resize(resize: dict) -> str:
    """One line for a worker group that restarted with another size (see RunRecorder.register_worker)."""
    return (
        f"resized {resize['from']} -> {resize['to']} workers at epoch {resize['epoch']} step {resize['step']} "
        f"(per-worker batch {resize['batch_from']} -> {resize['batch_to']})"
    )


def progress_bar(event: Progress, width: int = 20) -> str:
    """The running epoch as Keras' `Progbar` shows it: steps, bar, ETA, time per step, running loss.

    >>> progress_bar(Progress(epoch=1, step=5, steps=20, loss=0.25, samples_per_s=80.0, seconds=2.0))
    '5/20 ━━━━━─────────────── 6s 400ms/step - loss: 0.2500'
    """
    step, steps, seconds = event.step, event.steps, event.seconds or 0.0
    done = width * step // steps
    bar = "━" * done + "─" * (width - done)
    per_step = seconds / max(step, 1)
    return (
        f"{step}/{steps} {bar} {per_step * (steps - step):.0f}s {per_step * 1000:.0f}ms/step - loss: {event.loss:.4f}"
    )


class ConsoleProgress:
    """The driver's console during a run. The recorder reports a saved file once it is written,
    which may be before its epoch's line arrives: such a line waits, so the console reads in
    epoch order ("Epoch N: saved" after epoch N's line, never before an earlier epoch's)."""

    def __init__(self, epochs: int, stream: TextIO | None = None):
        self.epochs, self.stream = epochs, stream or sys.stdout
        self._live = self.stream.isatty()
        self._epoch_shown = 0
        self._epoch_ended = 0  # the last epoch whose line was shown
        self._saves_held: list[CheckpointWritten] = []

    def show(self, event: Progress | EpochEnded | CheckpointWritten | RunWarning) -> None:
        if isinstance(event, RunWarning):
            self._line(("\n" if self._live else "") + f"WARNING {event.text}")
            return
        if isinstance(event, CheckpointWritten):  # written by the actor, so no epoch header
            self._saves_held.append(event)
            self._show_saves()
            return
        if event.epoch != self._epoch_shown:
            self._epoch_shown = event.epoch
            self._line(f"Epoch {event.epoch}/{self.epochs}")
        if isinstance(event, Progress):
            if self._live:  # a log file gets the epoch's line only
                self.stream.write("\r" + progress_bar(event) + "\x1b[K")
                self.stream.flush()
            return
        logs = event.logs
        text = f"{event.seconds:.1f}s - {format_logs(logs)} - {logs['samples_per_s']:.0f} samples/s"
        self._line(("\r\x1b[K" if self._live else "") + text)
        warning = input_warning(event.epoch, logs)
        if warning:
            self._line(f"WARNING {warning}")
        self._epoch_ended = max(self._epoch_ended, event.epoch)
        self._show_saves()

    def _show_saves(self) -> None:
        ready = [e for e in self._saves_held if e.epoch <= self._epoch_ended]
        self._saves_held = [e for e in self._saves_held if e.epoch > self._epoch_ended]
        for event in ready:
            self._line(f"Epoch {event.epoch}: saved {event.file}")

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()


def tracking_line(when: str, info: dict) -> str:
    """Where the run's MLflow run is (`when`: started, finished), or that it is not created yet."""
    where = info.get("url") or f"{info['tracking_uri']} (browse: mlflow ui --backend-store-uri {info['tracking_uri']})"
    if not info.get("run_id"):
        return f"MLflow: run not created yet at {info['tracking_uri']}; retrying in the background"
    return f"MLflow run {info['run_id']} ({info['experiment']}) {when}: {where}"


def print_summary(result: TrainResult) -> None:
    """The run's closing lines: time, start-up phases, final figures, placement, where its files are."""
    final = result.final
    print(
        f"\nrayparallel: {result.name} finished in {result.seconds:.1f}s on {len(result.workers)} workers"
        + (f" (first step after {result.time_to_first_step_s:.1f}s)" if result.time_to_first_step_s else "")
    )
    print(f"  start-up (s since the command started): {describe(result.startup)}")
    print(f"  final: {format_logs(final)}")
    if result.stopped:
        print(f"  stopped early, {describe_stop(result.stopped)}")
    for name, figures in result.baselines.items():
        print(f"  baseline {name}: {format_logs(figures)}")
    print(
        "  placement: "
        + "; ".join(f"rank {w['rank']} on node {w['node_id'][:8]} gpus {w['gpu_ids'] or '-'}" for w in result.workers)
    )
    print(f"  weights: {result.final_weights}")
    if result.checkpoints:
        print(f"  checkpoints: {len(result.checkpoints)} in {result.checkpoint_dir}")
    print(f"  result:  {Path(result.output_dir) / 'result.json'}")
    if result.mlflow:
        print(tracking_line("finished", result.mlflow))
        if result.mlflow.get("unlogged"):
            print(
                f"MLflow: could not log {', '.join(result.mlflow['unlogged'])} to {result.mlflow['tracking_uri']} "
                f"({result.mlflow.get('unlogged_error') or 'not reached in time'}); "
                f"the records are in {result.mlflow['unlogged_path']} and every file is on disk in {result.output_dir}"
            )
