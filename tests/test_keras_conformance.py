"""The conformance matrix: models after Keras' guides and keras-io, each with a `compile`/`fit`
setting, trained by plain Keras `fit` in this process (the oracle) and by rayparallel on 1 and
2 workers, same data, seed and order. A cell ends with `fit`'s weights (SGD, 1e-5 of each tensor's
largest value, or of 1e-3 for a tensor that stays below it: the attention key bias of the
Transformer has a zero true gradient and holds round-off) and history (1e-4), or its Adam history
(1e-3). README's "Coming from model.fit" table is generated from
`CASES` (`test_the_readme_table_is_the_matrix`), so the two cannot drift."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

import rayparallel

from .helpers import REPO, final_weights, keras_fit, max_relative_error

MODELS = "tests.conformance_models"


@dataclass(frozen=True)
class Case:
    name: str  # what a Keras user would call the setting
    builder: str  # a builder of `tests.conformance_models` (it compiles its model)
    loader: str
    workers: tuple[int, ...]
    why: str  # the README's note: what makes it exact
    kwargs: dict = field(default_factory=dict)
    compare: str = "weights"  # or "history" (Adam: round-off grows, see the brief)


CASES = [
    Case(
        "`Embedding(mask_zero=True)` padding mask, sequence loss (guide: masking & padding)",
        "masked_tagger",
        "padded_tags",
        (1, 2),
        "Keras' loss applies the mask; its divisor, the count of unmasked tokens, is summed over the workers",
    ),
    Case(
        "`Masking` layer and per-token `sample_weight` of shape (rows, timesteps)",
        "masked_series",
        "padded_series",
        (2,),
        "the mask and the weights as `Loss.__call__` merges them; the kept tokens counted over all workers",
        {"per_token_weights": True},
    ),
    Case(
        "`global_clipnorm` with an `Embedding` (sparse gradients), keras-io Transformer",
        "clipped_transformer",
        "token_classes",
        (2,),
        "the optimizer clips the all-reduced gradient, as one device clips the whole batch's",
    ),
    Case(
        "a `train_step` returning raw tensors as logs (guide: customizing fit)",
        "raw_loss_step",
        "regression_rows",
        (2,),
        "as `fit`: logs that are not exactly the metrics' results are the epoch's last step's values (averaged over the workers)",
    ),
]


def table() -> str:
    """The matrix as README shows it."""
    rows = ["| setting | workers | equal to `fit` | how |", "| --- | --- | --- | --- |"]
    for case in CASES:
        compared = "weights 1e-5, history 1e-4" if case.compare == "weights" else "history 1e-3"
        rows.append(f"| {case.name} | {', '.join(map(str, case.workers))} | {compared} | {case.why} |")
    return "\n".join(rows)


def test_the_readme_table_is_the_matrix():
    assert table() in (REPO / "README.md").read_text(), f"README's conformance table should read:\n{table()}"


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[case.builder for case in CASES])
def test_rayparallel_trains_fits_model(ray_address, tmp_path, case):
    from tests import conformance_models

    build = getattr(conformance_models, case.builder)
    data = getattr(conformance_models, case.loader)(**case.kwargs)
    weights = {"sample_weight": data["sample_weight_train"]} if "sample_weight_train" in data else {}
    model, history = keras_fit(build, data, None, 2, **weights)
    spec = {
        "name": case.builder,
        "model": {"builder": f"{MODELS}:{case.builder}"},
        "data": {"loader": f"{MODELS}:{case.loader}", "kwargs": case.kwargs, "layout": "streams"},  # fit's order
        "train": {"global_batch_size": 8, "epochs": 2, "seed": 4},
        "mlflow": {"enabled": False},
    }
    for workers in case.workers:
        result = rayparallel.train(
            spec, overrides=[f"scaling.num_workers={workers}"], output_dir=tmp_path / str(workers), verbose=False
        )
        error = max_relative_error(final_weights(result.final_weights, build), model.get_weights(), floor=1e-3)
        print(f"{case.builder}, {workers} workers vs Keras fit: max relative weight error {error:.2e}")
        if case.compare == "weights":
            assert error < 1e-5
        tolerance = 1e-4 if case.compare == "weights" else 1e-3
        assert set(result.history[0]) >= set(history)
        for key, values in history.items():
            assert [epoch[key] for epoch in result.history] == pytest.approx(values, rel=tolerance, abs=1e-6), key
