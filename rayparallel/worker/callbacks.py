"""Keras callbacks in the workers' loop, called as `fit` calls them, with the global logs.

Every rank runs the callbacks that change training (stop, learning rate, restored
weights): they see the same global logs, decide the same on every rank, and the ranks
stay in step. Callbacks that write (CSVLogger, TensorBoard, a user's) run on rank 0 only,
unless their class sets `rayparallel_all_ranks = True`; a stop one of them asks for is
shared with every rank (`Callbacks.stop_reason`). Keras' own checkpoint callbacks are
refused: rayparallel's `checkpoint:` section and `--resume` do that work across workers.

Batch-level hooks run where the loop computes the global running loss (the progress
cadence), as Keras calls them every `steps_per_execution` batches.
"""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SpecError, describe
from ..spec.references import resolve

if TYPE_CHECKING:
    import keras

ALL_RANKS = "rayparallel_all_ranks"  # a user's callback class sets it True to run on every rank
CHANGES_TRAINING = ("EarlyStopping", "ReduceLROnPlateau", "LearningRateScheduler", "TerminateOnNaN")
REFUSED = {
    "ModelCheckpoint": "the job's checkpoint: section saves the base model's weights (filepath, monitor, "
    "save_best_only, save_freq)",
    "BackupAndRestore": "--resume (and run.resume_every_n_steps) continue an interrupted run",
}
RELATIVE_PATHS = {"CSVLogger": "filename", "TensorBoard": "log_dir"}  # under the run's output folder
DEFAULT_PATHS = {"TensorBoard": "logs"}
FUNCTIONS = {"LearningRateScheduler": "schedule"}  # config values given as "module:function"


def callback_classes(identifiers: list) -> list[tuple[type, dict]]:
    """Each `train.callbacks` entry as (class, keyword arguments); one-line errors otherwise.

    An entry is Keras' serialized form, `{class_name: EarlyStopping, config: {...}}` (or just
    the class name), a user's class, `{class: module:Class, kwargs: {...}}`, or (from
    `rayparallel.fit`) a callback instance, which each rank gets a copy of; its kwargs are None.
    """
    import keras

    resolved = []
    for i, entry in enumerate(identifiers):
        key = f"train.callbacks[{i}]"
        if isinstance(entry, keras.callbacks.Callback):
            _refuse(type(entry).__name__, key)
            resolved.append((type(entry), None))
            continue
        if isinstance(entry, str):
            entry = {"class_name": entry}
        if isinstance(entry, dict) and set(entry) <= {"class_name", "config"} and "class_name" in entry:
            name, kwargs = entry["class_name"], dict(entry.get("config") or {})
            _refuse(name, key)
            cls = getattr(keras.callbacks, str(name), None)
            if not (isinstance(cls, type) and issubclass(cls, keras.callbacks.Callback)):
                known = ", ".join(CHANGES_TRAINING + tuple(RELATIVE_PATHS))
                raise SpecError(f"{key}.class_name: expected a keras.callbacks class ({known}, ...), received {name!r}")
            if name == "TensorBoard" and importlib.util.find_spec("tensorboard") is None:
                raise SpecError(f"{key}: expected the tensorboard package for TensorBoard, received none installed")
            if name in FUNCTIONS and isinstance(kwargs.get(FUNCTIONS[name]), str):
                kwargs[FUNCTIONS[name]] = resolve(kwargs[FUNCTIONS[name]], f"{key}.config.{FUNCTIONS[name]}")
        elif isinstance(entry, dict) and set(entry) <= {"class", "kwargs"} and "class" in entry:
            cls, kwargs = resolve(entry["class"], f"{key}.class"), dict(entry.get("kwargs") or {})
            if not (isinstance(cls, type) and issubclass(cls, keras.callbacks.Callback)):
                raise SpecError(
                    f"{key}.class: expected a keras.callbacks.Callback subclass, received {entry['class']!r} ({cls!r})"
                )
        else:
            raise SpecError(
                f"{key}: expected {{class_name: <keras.callbacks class>, config: {{...}}}} or "
                f"{{class: module:Class, kwargs: {{...}}}}, received {describe(entry)}"
            )
        try:
            inspect.signature(cls).bind(**kwargs)
        except TypeError as exc:
            raise SpecError(
                f"{key}: expected arguments {cls.__name__} accepts, received {sorted(kwargs)} ({exc})"
            ) from None
        resolved.append((cls, kwargs))
    return resolved


def _refuse(name: str, key: str) -> None:
    if name in REFUSED:
        raise SpecError(f"{key}: expected a callback that runs across workers, received {name}; {REFUSED[name]}")


def make_callbacks(identifiers: list, rank: int, output_dir: str) -> list[keras.callbacks.Callback]:
    """The callbacks this rank runs: those that change training everywhere, writers on rank 0."""
    made = []
    for entry, (cls, kwargs) in zip(identifiers, callback_classes(identifiers), strict=True):
        if not (rank == 0 or cls.__name__ in CHANGES_TRAINING or getattr(cls, ALL_RANKS, False)):
            continue
        path_key = RELATIVE_PATHS.get(cls.__name__)
        if kwargs is None:  # an instance: this rank's own copy came with the spec (Ray unpickled it here)
            if path_key:
                setattr(entry, path_key, _under(output_dir, getattr(entry, path_key)))
            made.append(entry)
            continue
        if path_key:
            kwargs[path_key] = _under(output_dir, kwargs.get(path_key, DEFAULT_PATHS.get(cls.__name__, "")))
        made.append(cls(**kwargs))
    return made


def _under(output_dir: str, path: object) -> str:
    """A writer's relative path under the run's output folder (the workers' own folder is Ray's)."""
    path = Path(str(path))
    return str(path if path.is_absolute() else Path(output_dir) / path)


class Callbacks:
    """The rank's callbacks, with the hooks `fit` calls; remembers which one asked to stop."""

    def __init__(self, callbacks: list, model: keras.Model, optimizer: Any, params: dict):
        self.callbacks, self.model = callbacks, model
        model.optimizer = optimizer  # what ReduceLROnPlateau and LearningRateScheduler change
        model.stop_training = False
        self.stop_reason: str | None = None
        self.ends_on_nan = any(type(c).__name__ == "TerminateOnNaN" for c in callbacks)
        for callback in callbacks:
            callback.set_model(model)
            callback.set_params(params)

    def on_train_begin(self) -> None:
        for callback in self.callbacks:
            callback.on_train_begin({})

    def on_epoch_begin(self, epoch: int) -> None:
        for callback in self.callbacks:
            callback.on_epoch_begin(epoch - 1, {})  # Keras counts epochs from 0

    def on_train_batch_end(self, batch: int, logs: dict) -> None:
        self._each("on_train_batch_end", batch - 1, logs)

    def on_epoch_end(self, epoch: int, logs: dict) -> None:
        """`logs` as Keras keys them; a callback may add keys (ReduceLROnPlateau: learning_rate)."""
        self._each("on_epoch_end", epoch - 1, logs)

    def on_train_end(self, logs: dict) -> None:
        for callback in self.callbacks:
            callback.on_train_end(logs)

    def _each(self, hook: str, index: int, logs: dict) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(index, logs)
            if self.model.stop_training and self.stop_reason is None:
                self.stop_reason = f"{type(callback).__name__} stopped training"
