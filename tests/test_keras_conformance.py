"""The conformance matrix: models after Keras' guides and keras-io, each with a `compile`/`fit`
setting, trained by plain Keras `fit` in this process (the oracle) and by rayparallel on 1 and/or
2 workers, same data, seed and order. A cell ends with `fit`'s weights (SGD: 1e-5 of each
tensor's largest value, or of 1e-3 for a tensor that stays below it, such as the Transformer's
attention key bias, whose true gradient is zero and which holds round-off only) and history
(1e-4), or is refused before training in one line, as `fit` refuses it. The table of docs/from-fit.md
is generated from `CASES` (`test_the_docs_table_is_the_matrix`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest
import yaml

import rayparallel
from rayparallel.errors import RayParallelError

from .helpers import REPO, final_weights, keras_fit, max_relative_error, train_shared

MODELS = "tests.conformance_models"


@dataclass(frozen=True)
class Case:
    name: str  # the setting, as a Keras user would name it
    builder: str  # a builder of `tests.conformance_models` (it compiles its model)
    loader: str
    how: str  # the docs' note: what makes it exact, or why it is refused
    workers: tuple[int, ...] = (2,)
    kwargs: dict = field(default_factory=dict)  # the loader's
    builder_kwargs: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)  # `train:` keys beside the builder's compile
    refused: str = ""  # the start of the one-line error, for a cell refused before training


CASES = [
    Case(
        "`Embedding(mask_zero=True)` padding mask, a loss per token (guide: masking and padding)",
        "masked_tagger",
        "padded_tags",
        "Keras' loss applies the mask; its divisor, the count of unmasked tokens, is summed over the workers "
        "(3 workers: uneven rows and uneven padding)",
        workers=(3,),
    ),
    Case(
        "`Masking` layer and per-token `sample_weight` of shape (rows, timesteps)",
        "masked_series",
        "padded_series",
        "the mask and the weights as `Loss.__call__` merges them; the kept tokens counted over all workers",
        kwargs={"per_token_weights": True},
    ),
    Case(
        "`global_clipnorm` with an `Embedding` (sparse gradients), keras-io Transformer",
        "clipped_transformer",
        "token_classes",
        "the optimizer clips the all-reduced gradient, as one device clips the whole batch's",
    ),
    Case(
        "keras-io Transformer as written: `TokenAndPositionEmbedding` (positions looked up once, broadcast over "
        "the batch) under `global_clipnorm`",
        "position_transformer",
        "token_classes",
        "the position embedding's sparse gradient is summed over the workers, not gathered, so the clip norms "
        "the gradient `fit` norms (3 workers, uneven rows: the 57-row cell below)",
    ),
    Case(
        "the same Transformer under `clipnorm`",
        "position_transformer",
        "token_classes",
        "as above, each gradient clipped alone",
        builder_kwargs={"clip": "clipnorm"},
    ),
    Case(
        "a position embedding without clipping",
        "position_transformer",
        "token_classes",
        "the summed sparse gradient updates as the gathered one did",
        builder_kwargs={"clip": None},
    ),
    Case(
        "training and validation rows that are not multiples of the global batch (57 and 13 rows, batch 8)",
        "position_transformer",
        "token_classes",
        "the last, shorter batch is trained on and evaluated, split across the workers (3 workers: 1, 0, 0 rows "
        "of the last training batch), its loss over its own rows, as `fit` takes it",
        workers=(2, 3),
        kwargs={"rows": 57, "val_rows": 13},
    ),
    Case(
        "a model's own `train_step` and `test_step` with training and validation `sample_weight` (guide: "
        "customizing fit)",
        "weighted_own_steps",
        "weighted_rows",
        "each step gets `(x, y, sample_weight)` as `fit` packs it",
    ),
    Case(
        'two outputs: a `Loss` subclass with `reduction="sum"`, `loss_weights`, `metrics` and '
        "`weighted_metrics`, sample weights, an L2 regularizer; SGD with momentum, `weight_decay`, "
        "`clipnorm`, `use_ema` and a schedule",
        "compiled_two_outputs",
        "weighted_levels_and_kinds",
        "Keras' losses and optimizer; sums stay sums, regularizers count once (in `val_loss` too), "
        "the moving averages end in the model as `fit` leaves them",
    ),
    Case(
        "raw strings into `TextVectorization` and `StringLookup` layers, from a `tf.data` pipeline (keras-io: "
        "text classification from scratch, structured data)",
        "text_classifier",
        "review_batches",
        "strings go to the model as `fit` gives them (`fit` takes no NumPy strings)",
    ),
    Case(
        "a `train_step` returning raw tensors as logs (guide: customizing fit)",
        "raw_loss_step",
        "regression_rows",
        "as `fit`: logs that are not exactly the metrics' results are the epoch's last step's values "
        "(averaged over the workers)",
    ),
    Case(
        "a model's own `train_step` calling `compute_loss` on a padding mask (guide: customizing fit)",
        "masked_tagger_own_step",
        "padded_tags",
        "Keras' loss in the model's step divides by the kept tokens of all workers, times the workers: "
        "the step's averaged gradients are the global batch's",
    ),
    Case(
        "one `sample_weight` per row with a loss per token",
        "masked_series",
        "padded_series",
        "refused before training, one line (Keras' loss cannot apply them: `fit` fails too)",
        kwargs={"per_row_weights": True},
        refused="data.loader: expected sample weights the loss 'mean_squared_error' can apply",
    ),
    Case(
        "`sample_weight` together with `class_weight`",
        "clipped_transformer",
        "token_classes",
        "refused before training, one line (`fit` refuses them together too)",
        kwargs={"weighted": True},
        train={"class_weight": {0: 1.0, 1: 2.0}},
        refused="train.class_weight: expected class weights or the loader's sample_weight_train, not both",
    ),
]


def table() -> str:
    """The matrix as docs/from-fit.md shows it."""
    rows = ["| setting | workers | as `fit` | how |", "| --- | --- | --- | --- |"]
    for case in CASES:
        outcome = "refused" if case.refused else "weights 1e-5, history 1e-4"
        workers = ", ".join(map(str, case.workers))
        rows.append(f"| {case.name} | {workers} | {outcome} | {case.how} |")
    return "\n".join(rows)


def spec(case: Case) -> dict:
    return {
        "name": case.builder,
        "model": {"builder": f"{MODELS}:{case.builder}", "kwargs": case.builder_kwargs},
        "data": {"loader": f"{MODELS}:{case.loader}", "kwargs": case.kwargs, "layout": "streams"},  # fit's order
        "train": {"global_batch_size": 8, "epochs": 2, "seed": 4, **case.train},
        "mlflow": {"enabled": False},
    }


def test_the_docs_table_is_the_matrix():
    page = (REPO / "docs/from-fit.md").read_text()
    assert table() in page, f"docs/from-fit.md's conformance table should read:\n{table()}"


def case_id(case: Case) -> str:
    return "-".join([case.builder, *(f"{k}={v}" for k, v in {**case.builder_kwargs, **case.kwargs}.items())])


@pytest.mark.parametrize("case", [c for c in CASES if c.refused], ids=case_id)
def test_a_refused_cell_is_one_line_before_training(case):
    with pytest.raises(RayParallelError) as info:
        rayparallel.validate(spec(case), [f"scaling.num_workers={max(case.workers)}"])
    assert str(info.value).startswith(case.refused), str(info.value)
    assert "\n" not in str(info.value)


def sines_and_a_rest(global_batch_size: int) -> dict:
    """`tests.models.sine_streams` and 5 rows more than its full batches hold."""
    from tests.models import sine_streams

    data = sine_streams(global_batch_size)
    return dict(data, x_train=data["x_train"][:-3], y_train=data["y_train"][:-3])


def test_a_last_shorter_batch_is_taken_where_the_batch_is_free_and_left_out_once_said_where_fixed(capsys):
    """Where Keras `fit` can take the rows past the last full batch it does, and so does rayparallel; a stateful
    model cannot (its states are the batch's rows): they are left out, said once; a model's own step on a last
    batch the workers cannot share equally is refused (its means are per worker). A stateful model on shuffled
    rows (`fit`'s default `shuffle=True`) is said once."""
    from rayparallel.cluster.preflight import preflight
    from rayparallel.spec import load_spec
    from tests.models import lstm_job

    free = next(c for c in CASES if c.kwargs.get("rows") == 57)
    checks = preflight(load_spec(spec(free), ["scaling.num_workers=3"]))
    assert checks.source.last_partial and not checks.notes

    stateful = lstm_job("stateful-rest", "train.global_batch_size=8")
    stateful["data"] = {"loader": sines_and_a_rest, "layout": "streams"}
    rayparallel.validate(stateful)
    (note,) = [line for line in capsys.readouterr().out.splitlines() if "leaves out" in line]
    assert note.startswith("rayparallel: each epoch leaves out the last 5 training rows") and "stateful" in note

    shuffled = preflight(load_spec(lstm_job("stateful-shuffled", "data.layout=shuffle")))
    assert [re.sub(r"\(lstm_\d+\)", "(lstm)", note) for note in shuffled.notes] == [  # Keras numbers layer names
        "rayparallel: data.layout: shuffle (fit's shuffle=True) mixes rows of different streams in every batch of a "
        "stateful model (lstm): each row continues another row's state; layout: streams (shuffle=False) keeps row i "
        "of every batch on stream i"
    ]

    own = next(c for c in CASES if c.builder == "weighted_own_steps")
    with pytest.raises(RayParallelError) as info:  # 32 validation rows, batch 12: a last batch of 8 on 3 workers
        rayparallel.validate(spec(own), ["train.global_batch_size=12", "scaling.num_workers=3"])
    assert str(info.value).startswith("data.loader: expected rows that leave a last batch divisible by the 3 workers")
    assert "a last batch of 8 rows" in str(info.value)


def fit_oracle(build, data: dict):
    """Plain Keras `fit` in this process: on arrays via `keras_fit`, or on a loader's datasets as given."""
    import keras

    if not isinstance(data["x_train"], keras.utils.PyDataset) and hasattr(data["x_train"], "element_spec"):
        keras.utils.set_random_seed(4)
        model = build(batch_size=8)
        fitted = model.fit(data["x_train"], validation_data=data["x_val"], epochs=2, shuffle=False, verbose=0)
        return model, fitted.history
    weights = {"sample_weight": data["sample_weight_train"]} if "sample_weight_train" in data else {}
    return keras_fit(build, data, None, 2, **weights)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in CASES if not c.refused], ids=case_id)
def test_rayparallel_trains_fits_model(shared_workers, tmp_path, case):
    import functools
    import inspect

    from tests import conformance_models

    build = functools.partial(getattr(conformance_models, case.builder), **case.builder_kwargs)
    load = getattr(conformance_models, case.loader)
    batch = {"global_batch_size": 8} if "global_batch_size" in inspect.signature(load).parameters else {}
    model, history = fit_oracle(build, load(**case.kwargs, **batch))
    job = tmp_path / "job.yaml"  # the YAML path, as `rayparallel train job.yaml` reads it
    job.write_text(yaml.safe_dump(spec(case)))
    for workers in case.workers:
        overrides = [f"scaling.num_workers={workers}"]
        result = train_shared(shared_workers, str(job), overrides, output_dir=tmp_path / str(workers), verbose=False)
        error = max_relative_error(final_weights(result.final_weights, build), model.get_weights(), floor=1e-3)
        print(f"{case.builder}, {workers} workers vs Keras fit: max relative weight error {error:.2e}")
        assert error < 1e-5
        assert set(result.history[0]) >= set(history)
        for key, values in history.items():
            assert [epoch[key] for epoch in result.history] == pytest.approx(values, rel=1e-4, abs=1e-6), key
