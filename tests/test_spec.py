"""Job spec parsing and validation: pure logic, no Ray, no TensorFlow."""

from __future__ import annotations

import pytest

from rayparallel import load_spec
from rayparallel.errors import SpecError

BASE = {
    "name": "t",
    "model": {"builder": "tests.models:small_cnn"},
    "data": {"loader": "tests.models:blobs"},
    "train": {"global_batch_size": 8},
}


def with_(**sections):
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in BASE.items()}
    for dotted, value in sections.items():
        section, key = dotted.split("__")
        raw.setdefault(section, {})[key] = value
    return raw


def test_defaults_and_per_worker_batch():
    spec = load_spec(with_(scaling__num_workers=2))
    assert spec.per_worker_batch_size == 4 and spec.batch_split() == "4"
    uneven = load_spec(with_(train__global_batch_size=16, scaling__num_workers=3))
    assert uneven.worker_batch_sizes() == [6, 5, 5] and uneven.batch_split() == "6,5,5"
    assert uneven.per_worker_batch_size == 6
    elastic = load_spec(
        with_(train__global_batch_size=16, scaling__num_workers={"min": 2, "max": 3}), ["failure.max_failures=2"]
    )
    assert elastic.scaling.elastic and (elastic.scaling.min_workers, elastic.scaling.max_workers) == (2, 3)
    assert elastic.batch_split(2) == "8" and elastic.possible_batch_sizes == [5, 6, 8]
    assert elastic.to_dict()["scaling"]["num_workers"] == {"min": 2, "max": 3}  # job.yaml round trip
    assert spec.train.epochs == 1 and spec.data.layout == "shuffle"
    assert spec.scaling.placement_strategy == "PACK"


def test_any_worker_count_splits_every_global_batch_into_contiguous_near_equal_slices():
    from rayparallel.spec.schema import rank_rows

    for batch in range(1, 20):
        for workers in range(1, batch + 1):
            slices = [rank_rows(batch, workers, rank) for rank in range(workers)]
            assert slices[0][0] == 0 and slices[-1][1] == batch
            assert all(a[1] == b[0] for a, b in zip(slices, slices[1:], strict=False))  # contiguous, in order
            assert max(s[1] - s[0] for s in slices) - min(s[1] - s[0] for s in slices) <= 1


def test_overrides_are_yaml_typed_and_dotted():
    spec = load_spec(
        BASE,
        [
            "train.epochs=3",
            "train.optimizer={class_name: SGD, config: {learning_rate: 0.1}}",
            "scaling.resources_per_worker.CPU=0.5",
        ],
    )
    assert spec.train.epochs == 3
    assert spec.train.optimizer == {"class_name": "SGD", "config": {"learning_rate": 0.1}}
    assert spec.scaling.resources_per_worker == {"CPU": 0.5}


@pytest.mark.parametrize(
    "raw, overrides, message",
    [
        (
            with_(train__global_batch_size=9, scaling__num_workers=10),
            [],
            "scaling.num_workers: expected at most train.global_batch_size=9 workers (each worker needs at least "
            "one row of every batch), received 10",
        ),
        (with_(train__epochs=0), [], "train.epochs: expected a positive number, received 0"),
        (with_(scaling__num_workers=0), [], "scaling.num_workers: expected a positive number, received 0"),
        (
            with_(scaling__num_workers={"min": 3, "max": 2}),
            ["failure.max_failures=1"],
            "scaling.num_workers: expected min <= max, received min 3, max 2",
        ),
        (
            with_(scaling__num_workers={"min": 0, "max": 2}),
            ["failure.max_failures=1"],
            "scaling.num_workers.min: expected at least 1 worker, received 0",
        ),
        (
            with_(scaling__num_workers={"min": 1, "max": 9}),
            ["failure.max_failures=1"],
            "scaling.num_workers.max: expected at most train.global_batch_size=8 workers",
        ),
        (
            with_(scaling__num_workers={"min": 1, "max": 2}),
            [],
            "failure.max_failures: expected at least 1 with elastic scaling",
        ),
        (with_(scaling__num_workers={"min": 1}), [], "scaling.num_workers.max: required key is missing"),
        (
            with_(run__resume_every_n_steps=0),
            [],
            "run.resume_every_n_steps: expected a positive number of steps or null",
        ),
        (
            with_(run__resume_every_n_steps=5, run__storage_path="s3://bucket/runs"),
            [],
            "run.resume_every_n_steps: expected a run.storage_path on a local or mounted file system",
        ),
        (with_(train__global_batch_size=-4), [], "train.global_batch_size: expected a positive number, received -4"),
        (with_(train__epoch=3), [], "train.epoch: unknown key; expected one of"),
        (with_(train__epochs="three"), [], "train.epochs: expected an integer, received 'three' (str)"),
        (with_(train__epochs=True), [], "train.epochs: expected an integer, received True (bool)"),
        (
            with_(data__layout="stream"),
            [],
            "data.layout: expected one of ['streams', 'shuffle'], received 'stream' (str)",
        ),
        (
            with_(model__builder="tests.models.small_cnn"),
            [],
            "model.builder: expected 'module:function', received 'tests.models.small_cnn'",
        ),
        (with_(scaling__placement_strategy="spread"), [], "scaling.placement_strategy: expected one of"),
        ({k: v for k, v in BASE.items() if k != "train"}, [], "train: required key is missing"),
        (BASE, ["train.epochs"], "--set: expected KEY.PATH=VALUE, received 'train.epochs'"),
        (BASE, ["name.x=1"], "--set name.x: expected name to be a section, received 't' (str)"),
        (BASE, ["scalling.num_workers=2"], "scalling: unknown key"),
        (
            BASE,
            ["train.jit_compile=maybe"],
            "train.jit_compile: expected true or false or 'auto', received 'maybe' (str)",
        ),
        (
            BASE,
            ["train.dtype_policy=float16"],
            "train.dtype_policy: expected one of ['float32', 'mixed_float16', 'mixed_bfloat16']",
        ),
        (BASE, ["train.initial_loss_scale=0"], "train.initial_loss_scale: expected a positive number, received 0.0"),
        (
            BASE,
            ["train.gradient_compression=int8"],
            "train.gradient_compression: expected one of ['none', 'fp16', 'bf16']",
        ),
        (BASE, ["train.batch_norm=sync"], "train.batch_norm: expected one of ['global', 'local'], received 'sync'"),
        (
            BASE,
            ["name=my run/1"],
            "name: expected letters, digits, '.', '_' or '-' (it names the output folder and the Ray run), "
            "received 'my run/1'",
        ),
        (BASE, ["mlflow.register_alias=v2"], "mlflow.register_alias: expected letters, digits, '_' or '-', not"),
        (BASE, ["mlflow.register_alias=best model"], "mlflow.register_alias: expected letters, digits, '_' or '-'"),
    ],
)
def test_bad_specs_name_key_expected_and_received(raw, overrides, message):
    with pytest.raises(SpecError) as info:
        load_spec(raw, overrides)
    text = str(info.value)
    assert text.startswith(message), text
    assert "\n" not in text


def test_unknown_key_suggests_closest():
    with pytest.raises(SpecError, match=r"did you mean 'train.epochs'\?"):
        load_spec(with_(train__epoch=3))
    with pytest.raises(SpecError, match=r"did you mean 'scaling'\?"):
        load_spec(BASE, ["scalling.num_workers=2"])


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: x\nmodel:\n  builder: a:b\n  kwargs: {units: 3\ntrain: {}\n")
    with pytest.raises(SpecError, match=r"job.yaml: line \d+, column \d+: expected valid YAML"):
        load_spec(path)


def test_missing_job_file(tmp_path):
    with pytest.raises(SpecError, match="expected an existing YAML file, received .*nope.yaml"):
        load_spec(tmp_path / "nope.yaml")


def test_shipped_jobs_are_valid_specs():
    from pathlib import Path

    for path in sorted(Path(__file__).resolve().parents[1].glob("jobs/*.yaml")):
        spec = load_spec(path)
        assert spec.name and spec.train.global_batch_size % spec.scaling.num_workers == 0


def test_a_builder_given_by_value_reaches_the_recorder_unpickled_only_when_called():
    """The recorder's copy of a notebook builder (`Deferred`) is named as the builder and pickles as bytes:
    unpickling it imports nothing of what the builder imports, calling it builds what the builder builds."""
    import pickle
    import sys

    from rayparallel.spec.references import Deferred, deferred, reference_name

    namespace: dict = {"__name__": "notebook_cell"}
    exec("import colorsys\n\ndef build(batch_size):\n    return colorsys.rgb_to_hsv(batch_size, 0, 0)\n", namespace)
    sent = pickle.dumps(deferred(namespace["build"]))
    sys.modules.pop("colorsys", None)  # as TensorFlow in the recorder's new process: not imported yet
    copy = pickle.loads(sent)
    assert isinstance(copy, Deferred) and reference_name(copy) == "notebook_cell:build"
    assert "colorsys" not in sys.modules
    assert copy(batch_size=1) == (0.0, 1.0, 1) and "colorsys" in sys.modules
    assert deferred("jobs.stateful_lstm:build_model") == "jobs.stateful_lstm:build_model"
    assert pickle.loads(pickle.dumps(copy))._function is None  # the function itself never travels
