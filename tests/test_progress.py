"""The console: a Keras-style bar on a terminal, plain lines in a log file. Pure logic."""

from __future__ import annotations

import doctest
import importlib
import io

import pytest

from rayparallel.cluster.progress import ConsoleProgress
from rayparallel.recorder.events import CheckpointWritten, EpochEnded, Progress

from .helpers import REPO


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


EVENTS = [
    Progress(epoch=1, step=10, steps=40, loss=0.5, samples_per_s=800.0, seconds=1.0),
    Progress(epoch=1, step=30, steps=40, loss=0.25, samples_per_s=800.0, seconds=3.0),
    EpochEnded(epoch=1, logs={"loss": 0.2, "val_loss": 0.3, "samples_per_s": 800.0}, seconds=4.0),
]


def test_terminal_shows_the_running_epoch_as_a_progress_bar():
    stream = Terminal()
    progress = ConsoleProgress(epochs=2, stream=stream)
    for event in EVENTS:
        progress.show(event)
    text = stream.getvalue()
    assert text.startswith("Epoch 1/2\n")
    assert "\r10/40 ━━━━━─────────────── 3s 100ms/step - loss: 0.5000" in text
    assert "\r30/40 ━━━━━━━━━━━━━━━───── 1s 100ms/step - loss: 0.2500" in text
    assert text.endswith("4.0s - loss: 0.2 - val_loss: 0.3 - 800 samples/s\n")


def test_log_file_gets_plain_lines_only():
    stream = io.StringIO()
    progress = ConsoleProgress(epochs=2, stream=stream)
    for event in EVENTS:
        progress.show(event)
    assert stream.getvalue() == "Epoch 1/2\n4.0s - loss: 0.2 - val_loss: 0.3 - 800 samples/s\n"


WITH_EXAMPLES = sorted(
    ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
    for path in (REPO / "rayparallel").rglob("*.py")
    if ">>>" in path.read_text()
)


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_docstring_examples(name):
    """Every module whose docstrings hold examples runs them (those marked `+SKIP` need a cluster or a run)."""
    assert doctest.testmod(importlib.import_module(name)).failed == 0


def test_saved_lines_follow_their_epoch_and_slow_input_is_a_warning():
    stream = io.StringIO()
    progress = ConsoleProgress(epochs=3, stream=stream)
    figures = {"loss": 0.2, "samples_per_s": 800.0}
    events = [
        CheckpointWritten(epoch=1, file="ckpt/epoch-001.weights.h5"),  # written before its line arrived
        EpochEnded(epoch=1, logs=dict(figures, input_wait_fraction=0.001), seconds=4.0),
        EpochEnded(epoch=2, logs=dict(figures, input_wait_fraction=0.32), seconds=4.0),
        CheckpointWritten(epoch=2, file="ckpt/epoch-002.weights.h5"),  # after later lines: in order
    ]
    for event in events:
        progress.show(event)
    assert stream.getvalue().splitlines() == [
        "Epoch 1/3",
        "4.0s - loss: 0.2 - 800 samples/s",  # input_wait_fraction stays in result.json and MLflow
        "Epoch 1: saved ckpt/epoch-001.weights.h5",
        "Epoch 2/3",
        "4.0s - loss: 0.2 - 800 samples/s",
        "WARNING input: workers waited 32% of epoch 2 for data; see docs/data.md",
        "Epoch 2: saved ckpt/epoch-002.weights.h5",
    ]


def test_ray_data_warnings_reach_the_console_once_each():
    """What Ray Data logs in a worker (held back with the worker's own output) is passed on, one line per
    distinct warning, numbers aside; its info lines are not."""
    import logging

    from rayparallel.data.ray_data_warnings import ray_data_warnings_sent

    sent: list[str] = []
    starved = "Cluster resources are not enough to run any task from TaskPoolMapOperator[ReadFilesParquetV2]."
    with ray_data_warnings_sent(sent.append):
        log = logging.getLogger("ray.data._internal.execution.resource_manager")
        log.warning(starved + " The job may hang forever unless the cluster scales up.\nmore detail")
        log.warning(starved + " The job may hang forever unless the cluster scales up.")
        log.warning("Spilled 12 MiB to disk")
        log.warning("Spilled 40 MiB to disk")
        log.info("Execution plan of Dataset: ...")
    log.warning("after the run: not passed on")
    assert sent == [
        f"Ray Data: {starved} The job may hang forever unless the cluster scales up.",
        "Ray Data: Spilled 12 MiB to disk",
    ]
