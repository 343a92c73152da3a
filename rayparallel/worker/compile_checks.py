"""The job's compile settings checked against the model and its targets before training, each refusal one
line: keys by output name, names Keras resolves, targets of the output's shape, one history key per metric.

What the settings are is `compile_settings`'; Keras' own `compile` then decides what they compute (which
accuracy, the metrics' objects): nothing of that is re-derived here, only what a wrong setting would
make Keras do without a word (broadcast a target of another shape, share a history key).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import DataError, SpecError, describe
from .compile_settings import make_loss
from .outputs import output_names, per_output

if TYPE_CHECKING:
    import keras
    import numpy as np

    from ..spec import TrainSpec

# compile's names for the accuracy it picks from the loss and the shapes: the history key is the name given
ACCURACY = ("accuracy", "acc")


def check_settings(train: TrainSpec, model: keras.Model, y: Any) -> None:
    """Each output's loss, weight and metrics, checked against the targets `y` (in output order): keys by
    output name, names Keras resolves, targets of the output's shape, one history key per metric."""
    names = output_names(model)
    ys = list(y) if len(names) > 1 else [y]
    shapes = [tuple(output.shape) for output in model.outputs]
    losses = _by_output(train.loss, names, "train.loss", required=True)
    _weights(train.loss_weights, names)  # checked: compile takes them as given
    metrics = _by_output(train.metrics, names, "train.metrics", required=False, default=[])
    weighted = _by_output(train.weighted_metrics, names, "train.weighted_metrics", required=False, default=[])
    for name, y_k, shape in zip(names, ys, shapes, strict=True):
        check_targets(losses[name], y_k, shape, name if len(names) > 1 else "")
        prefix = f"{name}_" if len(names) > 1 else ""
        keys, weighted_keys = ({prefix + n for n in metric_names(given[name] or [])} for given in (metrics, weighted))
        shared = sorted(keys & weighted_keys)
        if shared:
            raise SpecError(
                f"train.weighted_metrics: expected names apart from train.metrics' (they share one history), "
                f"received {shared} in both"
            )
        make_loss(losses[name])


def check_targets(loss: str | dict, y: np.ndarray, output_shape: tuple, output: str = "") -> None:
    """Targets must have the model output's shape for the loss: Keras would broadcast a (b, 5)
    target against a (b, 1) output and train on something else without a word."""
    name = loss if isinstance(loss, str) else loss.get("class_name", "") if isinstance(loss, dict) else ""
    name = name.lower().replace("_", "")
    if not name or name not in _KNOWN_LOSSES:
        return  # a user's loss decides for itself
    target, out = tuple(y.shape[1:]), tuple(output_shape[1:])
    if "sparse" in name:  # integer labels: the output has one more axis (the classes)
        fits = target in (out[:-1], out[:-1] + (1,))
        wanted = f"{out[:-1]} (class indices)"
    else:
        fits = target == out or target + (1,) == out
        wanted = str(out)
    if not fits:
        which = f"[{output!r}]" if output else ""
        raise DataError(
            f"data.loader: expected y_train{which} rows of shape {wanted} to match the model's output {out} for the "
            f"loss {name!r}, received rows of shape {target}"
        )


_KNOWN_LOSSES = {
    "meansquarederror",
    "mse",
    "meanabsoluteerror",
    "mae",
    "huber",
    "logcosh",
    "meansquaredlogarithmicerror",
    "msle",
    "meanabsolutepercentageerror",
    "mape",
    "binarycrossentropy",
    "categoricalcrossentropy",
    "sparsecategoricalcrossentropy",
    "binaryfocalcrossentropy",
    "categoricalfocalcrossentropy",
    "kldivergence",
    "kld",
    "poisson",
    "cosinesimilarity",
    "hinge",
    "squaredhinge",
}


def metric_names(identifiers: list) -> list[str]:
    """The history keys `compile(metrics=...)` gives these metrics: a name as written (`accuracy`, whichever
    accuracy compile picks; `mae`), else the metric's own name; an identifier Keras does not know, refused."""
    import keras

    names = []
    for identifier in identifiers:
        if isinstance(identifier, str) and identifier in ACCURACY:
            names.append(identifier)
            continue
        try:
            metric = keras.metrics.get(identifier)
        except (ValueError, TypeError) as exc:
            raise SpecError(
                f"train.metrics: expected Keras metric names or {{class_name, config}}, received {identifier!r} ({exc})"
            ) from None
        names.append(identifier if isinstance(identifier, str) else getattr(metric, "name", None) or metric.__name__)
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SpecError(f"train.metrics: expected distinct metric names, received {duplicates} more than once")
    return names


def _by_output(value: Any, names: list[str], key: str, required: bool, default: Any = None) -> dict[str, Any]:
    if not per_output(value):
        return dict.fromkeys(names, value)  # one loss (or one metrics list) for every output, as compile does
    unknown = sorted(set(value) - set(names))
    if unknown:
        raise SpecError(f"{key}: expected keys among the model's outputs {names}, received {unknown}")
    missing = [name for name in names if name not in value]
    if required and missing:
        raise SpecError(f"{key}: expected a loss for every output {names}, received none for {missing}")
    return {name: value.get(name, default) for name in names}


def _weights(value: Any, names: list[str]) -> dict[str, float]:
    if value is None:
        return dict.fromkeys(names, 1.0)
    if isinstance(value, list):
        if len(value) != len(names):
            raise SpecError(
                f"train.loss_weights: expected one weight per output {names}, received {len(value)} ({value})"
            )
        return dict(zip(names, map(float, value), strict=True))
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise SpecError(f"train.loss_weights: expected keys among the model's outputs {names}, received {unknown}")
        return {name: float(value.get(name, 1.0)) for name in names}
    raise SpecError(f"train.loss_weights: expected a dict keyed by output name or a list, received {describe(value)}")
