"""Bad builders, loaders and data: one clear line before any training starts."""

from __future__ import annotations

import pytest

import rayparallel
from rayparallel.errors import RayParallelError

from .helpers import cli

LSTM = {
    "name": "bad",
    "model": {"builder": "tests.models:stateful_lstm"},
    "data": {"loader": "tests.models:sine_streams", "layout": "streams"},
    "train": {"global_batch_size": 4},
    "scaling": {"num_workers": 2},
}
REGRESSOR = {
    "name": "bad",
    "model": {"builder": "tests.models:dense_regressor"},
    "data": {"loader": "tests.models:linear_rows", "layout": "streams"},
    "train": {"global_batch_size": 8},
}
TWO_OUTPUTS = {
    "name": "bad",
    "model": {"builder": "tests.models:two_outputs"},
    "data": {"loader": "tests.models:levels_and_kinds", "layout": "streams"},
    "train": {"global_batch_size": 8, "loss": {"level": "mse", "kind": "sparse_categorical_crossentropy"}},
}
MASKED_SERIES = {
    "name": "bad",
    "model": {"builder": "tests.conformance_models:masked_series"},
    "data": {"loader": "tests.conformance_models:padded_series", "layout": "streams"},
    "train": {"global_batch_size": 8},
    "scaling": {"num_workers": 2},
}
CNN = {
    "name": "bad",
    "model": {"builder": "tests.models:small_cnn"},
    "data": {"loader": "tests.models:blobs"},
    "train": {"global_batch_size": 8, "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"]},
}


@pytest.mark.parametrize(
    "base, overrides, message",
    [
        (
            CNN,
            ["model.builder=tests.models:not_a_model"],
            "model.builder: expected a keras.Model, received 'a string' (str) from 'tests.models:not_a_model'",
        ),
        (
            CNN,
            ["model.builder=tests.models:fixed_batch_32", "scaling.num_workers=2"],
            "model.builder: expected a model with batch size 4 (the per-worker batch), received input",
        ),
        (
            CNN,
            ["model.builder=tests.models:own_train_step_cnn", "train.gradient_accumulation_steps=2"],
            "train.gradient_accumulation_steps: expected 1 for a model with its own train_step (its step cannot "
            "apply rayparallel's version of it exactly), received 2",
        ),
        (
            REGRESSOR,
            ["model.builder=tests.models:guide_train_step", "scaling.num_workers=3"],
            "scaling.num_workers: expected a divisor of train.global_batch_size for a model with its own "
            "train_step, test_step (its step cannot apply rayparallel's version of it exactly), received 3 (uneven",
        ),
        (
            REGRESSOR,
            ["model.builder=tests.models:guide_compute_loss", "scaling.num_workers=3"],
            "scaling.num_workers: expected a divisor of train.global_batch_size for a model with its own "
            "compute_loss (its step cannot apply rayparallel's version of it exactly), received 3 (uneven",
        ),
        (
            REGRESSOR,
            ["model.builder=tests.models:no_logs_step"],
            "model.train_step: expected a dict of logs (as Keras' own step returns), received {}",
        ),
        (
            REGRESSOR,
            ["model.builder=tests.models:compiled_regressor", "train.loss=mse"],
            "train.loss: expected the builder's compile(loss=Huber) or nothing, received 'mse' beside it",
        ),
        (
            CNN,
            ["data.loader=tests.models:tf_data_blobs", "data.kwargs.batch_size=4"],
            "data.loader: expected x_train batched with the global batch size 8 (train.global_batch_size), received "
            "batches of 4 rows",
        ),
        (
            CNN,
            ["data.loader=tests.models:tf_data_blobs", "data.kwargs.repeat=true"],
            "train.steps_per_epoch: expected a number of steps for x_train, a tf.data.Dataset of unknown or infinite "
            "length (as fit needs), received none",
        ),
        (
            CNN,
            ["data.loader=tests.models:tf_data_blobs", "data.kwargs.y=true"],
            "data.loader: expected no y_train beside a dataset x_train (its elements are (x, y[, sample_weight]), as "
            "fit takes them), received y_train",
        ),
        (
            CNN,
            ["data.loader=tests.models:tf_data_blobs", "data.kwargs.outputs=2", "train.class_weight={0: 2.0}"],
            "train.class_weight: expected a model with one output (as fit), received several outputs",
        ),
        (
            CNN,
            ["train.steps_per_epoch=3"],
            "train.steps_per_epoch: expected only with a loader that returns datasets",
        ),
        (
            CNN,
            ["model.builder=tests.nowhere:build"],
            "model.builder: expected an importable 'module:function', received 'tests.nowhere:build'",
        ),
        (
            CNN,
            ["data.loader=tests.models:no_such_loader"],
            "data.loader: expected 'tests.models' to define 'no_such_loader'",
        ),
        (
            CNN,
            ["data.loader=tests.models:mismatched_lengths"],
            "data.loader: expected x_train and y_train with the same number of rows, received x_train=40, y_train=39",
        ),
        (
            CNN,
            ["data.loader=tests.models:too_few_rows"],
            "data.loader: expected at least one global batch (8 rows) in train, received 3 rows",
        ),
        (
            CNN,
            ["data.loader=tests.models:with_nan", "data.check_finite=true"],
            "data.loader: expected finite values in x_train, received NaN/inf at row 5",
        ),
        (CNN, ["train.optimizer=adamm"], "train.optimizer: expected a Keras optimizer name"),
        (CNN, ["train.loss=msee"], "train.loss: expected a Keras loss name"),
        (CNN, ["train.metrics=[acuracy]"], "train.metrics: expected Keras metric names"),
        (
            TWO_OUTPUTS,
            ["train.loss={level: mse, kinds: mse}"],
            "train.loss: expected keys among the model's outputs ['level', 'kind'], received ['kinds']",
        ),
        (
            TWO_OUTPUTS,
            ["train.metrics={levl: [mae]}"],
            "train.metrics: expected keys among the model's outputs ['level', 'kind'], received ['levl']",
        ),
        (
            TWO_OUTPUTS,
            ["train.class_weight={0: 2.0}"],
            "train.class_weight: expected a model with one output (one y_train array), received several",
        ),
        (
            TWO_OUTPUTS,
            ["train.loss_weights=[1.0]"],
            "train.loss_weights: expected one weight per output ['level', 'kind'], received 1 ([1.0])",
        ),
        (
            REGRESSOR,
            ["data.loader=tests.models:levels_and_kinds"],
            "data.loader: expected y_train keyed by the model's outputs ['dense",
        ),
        (REGRESSOR, ["train.gradient_accumulation_steps=0"], "train.gradient_accumulation_steps: expected a positive"),
        (
            REGRESSOR,
            ["train.gradient_accumulation_steps=5"],
            "train.gradient_accumulation_steps: expected a divisor of the 12 steps per epoch, so every epoch ends on "
            "an update, received 5",
        ),
        (
            REGRESSOR,
            ["data.kwargs.bad_weights=1"],
            "data.loader: expected sample_weight_train with one weight per row of y_train (shape (96,), or (96, "
            "timesteps) per token), received shape (95,)",
        ),
        (
            REGRESSOR,
            ["data.kwargs.weighted=true", "train.class_weight={0: 2.0}"],
            "train.class_weight: expected class weights or the loader's sample_weight_train, not both",
        ),
        (
            CNN,
            ["train.class_weight={0: 1.0, 7: 2.0}"],
            "train.class_weight: expected keys among the labels 0..2, received ['7']",
        ),
        (
            CNN,
            ["model.builder=tests.models:sequential_without_input"],
            "model.builder: expected a model with defined inputs, received a Sequential without an Input from "
            "'tests.models:sequential_without_input'; start it with keras.Input(batch_shape=(batch_size, ...))",
        ),
        (
            LSTM,
            ["data.loader=tests.models:wide_targets", "train.loss=mse"],
            "data.loader: expected y_train rows of shape (5, 1) to match the model's output (5, 1) for the loss "
            "'mse', received rows of shape (5, 5)",
        ),
        (
            CNN,
            ["train.callbacks=[{class_name: ModelCheckpoint, config: {filepath: x.keras}}]"],
            "train.callbacks[0]: expected a callback that runs across workers, received ModelCheckpoint; the job's "
            "checkpoint: section",
        ),
        (
            CNN,
            ["train.callbacks=[BackupAndRestore]"],
            "train.callbacks[0]: expected a callback that runs across workers, received BackupAndRestore; --resume",
        ),
        (
            CNN,
            ["train.callbacks=[EarlyStoping]"],
            "train.callbacks[0].class_name: expected a keras.callbacks class (EarlyStopping, ReduceLROnPlateau",
        ),
        (
            CNN,
            ["train.callbacks=[{class: 'tests.callbacks:NotACallback'}]"],
            "train.callbacks[0].class: expected a keras.callbacks.Callback subclass, received 'tests.callbacks:NotA",
        ),
        (
            CNN,
            ["train.callbacks=[{class_name: EarlyStopping, config: {patients: 2}}]"],
            "train.callbacks[0]: expected arguments EarlyStopping accepts, received ['patients']",
        ),
        (
            CNN,
            ["train.callbacks=[{name: EarlyStopping}]"],
            "train.callbacks[0]: expected {class_name: <keras.callbacks class>, config: {...}} or {class: module:Class",
        ),
        (
            CNN,
            ["train.optimizer={class_name: Adam, config: {learning_rate: {class_name: CosineDecy, config: {}}}}"],
            "train.optimizer.config.learning_rate: expected a number or a keras.optimizers.schedules class",
        ),
        (
            MASKED_SERIES,
            ["data.kwargs.per_row_weights=true"],
            "data.loader: expected sample weights the loss 'mean_squared_error' can apply to its values (one per row, or "
            "per element of a loss per token, as fit takes them), received shape (4,) (InvalidArgumentError: ",
        ),
        (
            LSTM,
            ["data.loader=tests.models:small_cnn"],
            "data.loader: expected a dict with x_train, y_train[, x_val, y_val] (or x_train[, x_val] as datasets), "
            "received <Functional",
        ),
    ],
)
def test_bad_input_is_one_clear_line(base, overrides, message):
    with pytest.raises(RayParallelError) as info:
        rayparallel.validate(base, overrides)
    text = str(info.value)
    assert text.startswith(message), text
    assert "\n" not in text


def test_valid_jobs_pass_validation():
    assert rayparallel.validate(LSTM).per_worker_batch_size == 2
    assert rayparallel.validate(CNN, ["scaling.num_workers=2"]).per_worker_batch_size == 4


@pytest.mark.slow  # a whole CLI process up to the driver's checks (15 s); the same line in-process above is fast
def test_cli_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: x\nmodel: {builder: 'tests.models:not_a_model'}\n"
        "data: {loader: 'tests.models:blobs'}\ntrain: {global_batch_size: 8}\n"
    )
    out = tmp_path / "out"
    run = cli("train", str(job), "--output-dir", str(out))
    assert run.returncode == 2, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("rayparallel: error:")]
    assert errors == [
        "rayparallel: error: model.builder: expected a keras.Model, received 'a string' (str) from 'tests.models:not_a_model'"
    ]
    assert "Traceback" not in run.stderr
    assert not out.exists()


def test_cli_spec_error_needs_no_tensorflow(tmp_path):
    run = cli("validate", "jobs/stateful_lstm.yaml", "--set", "scaling.num_workers=9")
    assert run.returncode == 2
    assert run.stderr.strip() == (
        "rayparallel: error: scaling.num_workers: expected at most train.global_batch_size=8 workers "
        "(each worker needs at least one row of every batch), received 9"
    )


def test_output_dir_naming_an_existing_file_is_one_line_and_keeps_the_file(tmp_path):
    """Refused before Ray starts (a bad folder costs no start), and a folder under a file too."""
    import ray

    blocker = tmp_path / "out"
    blocker.write_text("keep me")
    connected = ray.is_initialized()
    with pytest.raises(RayParallelError) as info:
        rayparallel.train(CNN, output_dir=blocker, verbose=False)
    assert str(info.value) == f"--output-dir: expected a folder, received '{blocker}' (an existing file)"
    with pytest.raises(RayParallelError) as info:
        rayparallel.train(CNN, output_dir=blocker / "run", verbose=False)
    assert str(info.value) == (
        f"--output-dir: expected a writable folder with free space, received '{blocker / 'run'}' "
        f"(a file on its path: {blocker})"
    )
    assert blocker.read_text() == "keep me" and ray.is_initialized() == connected


def test_a_pydataset_that_is_empty_or_fails_is_one_line(tmp_path):
    from tests.models import write_images

    spec = dict(CNN, data={"loader": "tests.models:png_images", "kwargs": {"folder": str(tmp_path)}})
    with pytest.raises(RayParallelError, match=r"^data.loader: expected x_train with at least one batch, received an "):
        rayparallel.validate(spec)
    write_images(tmp_path, rows=16)
    (tmp_path / "image-000-1.png").write_bytes(b"not a png")
    with pytest.raises(RayParallelError) as info:
        rayparallel.validate(spec)
    assert str(info.value).startswith("data.loader: expected x_train to give batch 0, received "), info.value
    assert "\n" not in str(info.value)
