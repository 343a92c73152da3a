"""A user's callbacks and schedules, referenced from job specs ("tests.callbacks:...")."""

from __future__ import annotations

import json

import keras


class EpochRecorder(keras.callbacks.Callback):
    """A writer: one JSON line per epoch (rank 0 only, unless `rayparallel_all_ranks`)."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def on_epoch_end(self, epoch, logs=None):
        with open(self.path, "a") as handle:
            handle.write(json.dumps({"epoch": epoch, **(logs or {})}) + "\n")


class EveryRankRecorder(EpochRecorder):
    rayparallel_all_ranks = True


def halve_then_explode(epoch: int, learning_rate: float) -> float:
    """0.02, 0.02, then halved each epoch, then infinite from the fifth epoch (a NaN loss)."""
    if epoch >= 4:
        return float("inf")
    return learning_rate if epoch < 2 else learning_rate * 0.5


class NotACallback:
    pass
