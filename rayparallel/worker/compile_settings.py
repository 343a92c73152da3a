"""The job's compile settings, resolved: from `train:` or from a builder that compiled its model, as the
Keras objects `compile` would make of them.

A Keras user's builder usually ends with `model.compile(...)`: its optimizer, loss, loss
weights and metrics are then the job's, as live objects (a Huber's delta, a schedule and
an optimizer's clipping all kept), and `train.optimizer`/`loss`/`metrics` may be left out.
Given both and different, the job is refused with one line naming both. A model its builder
did not compile is compiled here with the job's settings (`compile_model`); every step then
runs the model's own `compute_loss` and `compute_metrics`. What of the settings the driver
checks before training is `compile_checks`'.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from ..errors import SpecError, first_line
from .loss_reduction import keras_loss

if TYPE_CHECKING:
    import keras

    from ..spec import TrainSpec

# train: without a compiled builder, as before
DEFAULTS = {"optimizer": "adam", "loss": "mean_squared_error"}
COMPILED = ("optimizer", "loss", "loss_weights", "metrics", "weighted_metrics")


def resolve(train: TrainSpec, model: keras.Model, check: bool = True) -> TrainSpec:
    """`train` with the compile's settings where the builder compiled, the defaults where neither says.

    Workers resolve without the `check` the driver made: comparing may create optimizers, and a
    variable made inside the strategy's scope is a collective.
    """
    compiled = _compiled_settings(model)
    settings = {}
    for key in COMPILED:
        given, theirs = getattr(train, key), compiled.get(key)
        if theirs is None or theirs == []:
            settings[key] = DEFAULTS.get(key) if given is None else given
            continue
        if check and given not in (None, []) and _fingerprint(key, given) != _fingerprint(key, theirs):
            raise SpecError(
                f"train.{key}: expected the builder's compile({key}={_shown(theirs)}) or nothing, received "
                f"{given!r} beside it"
            )
        settings[key] = _by_output_name(theirs, model) if key != "optimizer" else theirs
    return dataclasses.replace(train, **settings)


def compile_model(model: keras.Model, optimizer: keras.optimizers.Optimizer, train: TrainSpec) -> None:
    """A model its builder did not compile gets the job's settings, as `compile` would give them: every
    step reads the model's `compute_loss`, `compute_metrics` and `metrics` (a model's own also `self.optimizer`)."""
    if not model.compiled:
        model.compile(
            optimizer=optimizer,
            loss=_objects(train.loss, "loss"),
            loss_weights=train.loss_weights,
            metrics=_objects(train.metrics, "metrics"),
            weighted_metrics=_objects(train.weighted_metrics, "metrics"),
        )


def _objects(value: Any, kind: str) -> Any:
    """`{class_name, config}` as the Keras object it names: compile reads a dict as one entry per output.
    Names stay names, for compile to resolve as it does (`accuracy` by the targets' shape)."""
    import keras

    if isinstance(value, dict) and "class_name" in value:
        return make_loss(value) if kind == "loss" else keras.metrics.get(value)
    if isinstance(value, dict):
        return {name: _objects(entry, kind) for name, entry in value.items()}
    if isinstance(value, list):
        return [_objects(entry, kind) for entry in value]
    return value


def described(given: TrainSpec, used: TrainSpec) -> dict[str, str]:
    """The settings `train:` left out, as they were used (the compile's or the defaults), for MLflow's params."""
    return {
        f"train.{key}": _shown_in_full(getattr(used, key))
        for key in COMPILED
        if getattr(given, key) in (None, []) and getattr(used, key) not in (None, [])
    }


def _shown_in_full(value: Any) -> str:
    if isinstance(value, dict) and "class_name" not in value:
        return str({k: _shown_in_full(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return str([_shown_in_full(v) for v in value])
    if not hasattr(value, "get_config"):
        return getattr(value, "__name__", str(value))
    config = {k: v for k, v in value.get_config().items() if k != "name"}
    config.update(getattr(value, "_fn_kwargs", {}))  # a wrapped loss's arguments, which its config may drop
    return f"{type(value).__name__}({', '.join(f'{k}={v!r}' for k, v in config.items())})"


def _compiled_settings(model: keras.Model) -> dict:
    if not getattr(model, "compiled", False):
        return {}
    return dict(model._compile_config.config)  # live objects, as passed to compile


def _by_output_name(value: Any, model: keras.Model) -> Any:
    """compile's list in output order, as the dict by output name `train:` uses."""
    names = list(model.output_names)
    if isinstance(value, (list, tuple)) and len(names) > 1 and len(value) == len(names):
        return dict(zip(names, value, strict=True))
    return value


def _fingerprint(key: str, value: Any) -> str:
    """A comparable form: names resolved to Keras objects, then shown as `described` shows them
    (class and config without its name, or a function's name); metrics compare by name."""
    import keras

    if isinstance(value, dict) and "class_name" not in value:
        return str({k: _fingerprint(key, v) for k, v in sorted(value.items())})
    if isinstance(value, (list, tuple)):
        return str([_fingerprint(key, v) for v in value])
    if key in ("metrics", "weighted_metrics"):
        return value if isinstance(value, str) else getattr(value, "name", repr(value))
    module = keras.optimizers if key == "optimizer" else keras.losses if key == "loss" else None
    if module is not None and isinstance(value, (str, dict)):
        try:
            value = module.get(value)
        except (ValueError, TypeError):
            return repr(value)
    return _shown_in_full(value)


def _shown(value: Any) -> str:
    return type(value).__name__ if hasattr(value, "get_config") else repr(value)


def make_optimizer(identifier: str | dict) -> keras.optimizers.Optimizer:
    import keras

    identifier = _with_schedule(identifier)
    try:
        return keras.optimizers.get(identifier)
    except (ValueError, TypeError) as exc:
        raise SpecError(
            f"train.optimizer: expected a Keras optimizer name or {{class_name, config}}, received {identifier!r} ({exc})"
        ) from None


def accumulate_schedule(optimizer: keras.optimizers.Optimizer, steps: int) -> None:
    """With gradient accumulation, Keras' optimizer counts Adam's steps per update but feeds its
    learning-rate schedule the count of batches; ours counts updates, so the schedule is asked
    for the batch count of each update (update u is batch u*k + k-1), as Keras asks it."""
    import keras

    schedule = optimizer._learning_rate
    if steps <= 1 or not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
        return

    class PerBatch(keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, update):
            return schedule(update * steps + steps - 1)

        def get_config(self):
            return {"schedule": keras.optimizers.schedules.serialize(schedule), "steps": steps}

    optimizer._learning_rate = PerBatch()


def _with_schedule(identifier: str | dict) -> str | dict:
    """`learning_rate: {class_name: CosineDecay, config: {...}}` as users write it, made the
    `keras.optimizers.schedules` object Keras' optimizer config needs (it only finds its own
    classes there when the dict also names their module)."""
    import keras

    rate = identifier.get("config", {}).get("learning_rate") if isinstance(identifier, dict) else None
    if not isinstance(rate, dict):
        return identifier
    try:
        schedule = keras.optimizers.schedules.deserialize(rate)
        if not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
            raise ValueError(f"not a class of keras.optimizers.schedules: {rate.get('class_name')!r}")
    except (ValueError, TypeError) as exc:
        first = first_line(exc)
        raise SpecError(
            "train.optimizer.config.learning_rate: expected a number or a keras.optimizers.schedules class as "
            f"{{class_name, config}} (CosineDecay, ExponentialDecay, ...), received {rate!r} ({first})"
        ) from None
    return {**identifier, "config": {**identifier["config"], "learning_rate": schedule}}


def make_loss(identifier: str | dict) -> keras.losses.Loss:
    """The Keras `Loss` `compile` makes of a name, a {class_name, config} or a live object."""
    try:
        loss = keras_loss(identifier)
    except (ValueError, TypeError) as exc:
        raise SpecError(
            f"train.loss: expected a Keras loss name or {{class_name, config}}, received {identifier!r} ({exc})"
        ) from None
    if loss is None:
        raise SpecError(f"train.loss: expected a Keras loss name or {{class_name, config}}, received {identifier!r}")
    return loss
