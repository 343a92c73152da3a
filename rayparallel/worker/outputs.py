"""A model's outputs and what `compile` gives each: its loss, loss weight and metrics.

One output is the common case (`loss: mse`, `metrics: [mae]`, history keys `loss`, `mae`).
With several, the job keys `train.loss`, `train.loss_weights` and `train.metrics` by output
name as `compile` does, the targets are a dict keyed by output name (or a tuple in output
order), and the history uses Keras' names: `loss` (the weighted sum), `<output>_loss`,
`<output>_<metric>`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import DataError, SpecError, describe
from . import compile_objects

if TYPE_CHECKING:
    import keras

    from ..spec import TrainSpec


@dataclass
class Head:
    """One output: the loss on its rows, its weight in the total, its metrics with history names."""

    name: str
    loss: keras.losses.Loss  # Keras' own: masks, sample weights, reduction (global: `loss_reduction`)
    weight: float
    metrics: list[tuple[str, keras.metrics.Metric]]  # as compile's `metrics`: unweighted
    weighted: list[tuple[str, keras.metrics.Metric]]  # compile's `weighted_metrics`: weighted by the sample weights

    @property
    def all_metrics(self) -> list[tuple[str, keras.metrics.Metric]]:
        return self.metrics + self.weighted


def output_names(model: keras.Model) -> list[str]:
    return list(model.output_names)


def per_output(value: Any) -> bool:
    """A dict keyed by output name, not a Keras identifier such as {class_name, config}."""
    return isinstance(value, dict) and "class_name" not in value


def targets_by_output(y: Any, names: list[str], split: str) -> Any:
    """The loader's targets in output order: one array for one output, else a tuple."""
    if len(names) == 1 and not isinstance(y, (dict, tuple)):
        return y
    if isinstance(y, dict):
        if set(y) != set(names):
            raise DataError(
                f"data.loader: expected y_{split} keyed by the model's outputs {names}, received keys {sorted(y)}"
            )
        y = tuple(y[name] for name in names)
    if not isinstance(y, tuple) or len(y) != len(names):
        raise DataError(
            f"data.loader: expected y_{split} as a dict keyed by output name (or a tuple in output order) for a "
            f"model with outputs {names}, received {describe(y)}"
        )
    return y if len(names) > 1 else y[0]


def make_heads(train: TrainSpec, model: keras.Model, y: Any) -> list[Head]:
    """Each output's loss, weight and metrics, checked against the targets `y` (in output order)."""
    names = output_names(model)
    ys = list(y) if len(names) > 1 else [y]
    shapes = [tuple(output.shape) for output in model.outputs]
    losses = _by_output(train.loss, names, "train.loss", required=True)
    weights = _weights(train.loss_weights, names)
    metrics = _by_output(train.metrics, names, "train.metrics", required=False, default=[])
    weighted = _by_output(train.weighted_metrics, names, "train.weighted_metrics", required=False, default=[])
    heads = []
    for name, y_k, shape in zip(names, ys, shapes, strict=True):
        compile_objects.check_targets(losses[name], y_k, shape, name if len(names) > 1 else "")
        prefix = f"{name}_" if len(names) > 1 else ""
        made, made_weighted = (
            [(prefix + m.name, m) for m in compile_objects.make_metrics(given[name] or [], losses[name], y_k, shape)]
            for given in (metrics, weighted)
        )
        shared = sorted({n for n, _ in made} & {n for n, _ in made_weighted})
        if shared:
            raise SpecError(
                f"train.weighted_metrics: expected names apart from train.metrics' (they share one history), "
                f"received {shared} in both"
            )
        heads.append(Head(name, compile_objects.make_loss(losses[name]), weights[name], made, made_weighted))
    return heads


def listed(values: Any, heads: list[Head]) -> list:
    """Targets or predictions in the heads' order: one output gives one tensor, several a tuple in output
    order or a dict keyed by output name."""
    if len(heads) == 1:
        return [values[0] if isinstance(values, (list, tuple)) else values]
    return [values[head.name] for head in heads] if isinstance(values, dict) else list(values)


def epoch_keys(heads: list[Head]) -> list[str]:
    """The history keys of one epoch's training figures, as Keras names them."""
    keys = ["loss"]
    if len(heads) > 1:
        keys += [f"{head.name}_loss" for head in heads]
    return keys + [name for head in heads for name, _ in head.all_metrics]


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
