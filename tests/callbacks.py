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


class StopAfterRegrowing(keras.callbacks.Callback):
    """Ends the run `epochs` epochs into a worker group of `workers` that started after epoch 1 (an
    elastic run that grew back): what the elastic test needs to see, without the epochs after it."""

    rayparallel_all_ranks = True

    def __init__(self, workers: int, epochs: int):
        super().__init__()
        self.workers, self.epochs, self.first = workers, epochs, None

    def on_epoch_begin(self, epoch, logs=None):
        if self.first is None:
            self.first = epoch  # Keras counts from 0: a group that resumed starts later

    def on_epoch_end(self, epoch, logs=None):
        import ray.train

        regrown = self.first > 0 and ray.train.get_context().get_world_size() == self.workers
        if regrown and epoch + 1 - self.first >= self.epochs:
            self.model.stop_training = True
