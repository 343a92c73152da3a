"""Checkpoints: template names, keep rules, export at batch 1, writes off the training step."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

import rayparallel
from rayparallel.errors import RayParallelError, RunFailedError
from tests.models import lstm_job

from .helpers import cli, train_shared

LSTM = lstm_job(
    "ckpt-lstm",
    "train.epochs=4",
    "checkpoint.monitor=val_loss",
    "checkpoint.mode=min",
    "checkpoint.keep=1",
    "checkpoint.filepath=lstm-{epoch:02d}-{val_loss:.4f}-{val_mae:.4f}.weights.h5",
    "mlflow.enabled=false",  # not what these tests are about; logging the model costs seconds a run
)


@pytest.fixture(scope="module")
def trained(shared_workers, tmp_path_factory):
    return train_shared(shared_workers, LSTM, output_dir=tmp_path_factory.mktemp("ckpt"), verbose=False)


@pytest.mark.slow
def test_files_named_by_template_and_kept_by_rule(trained):
    folder = trained.checkpoint_dir
    manifest = json.loads(open(f"{folder}/manifest.json").read())
    history = trained.history
    best_epoch = int(np.argmin([h["val_loss"] for h in history])) + 1
    expected = {
        f"lstm-{e:02d}-{history[e - 1]['val_loss']:.4f}-{history[e - 1]['val_mae']:.4f}.weights.h5"
        for e in {best_epoch, len(history)}
    }  # keep: 1 -> the best one plus the latest
    import os

    on_disk = {f for f in os.listdir(folder) if f.endswith(".weights.h5") and f != "final.weights.h5"}
    assert on_disk == expected
    assert {c["file"] for c in manifest["checkpoints"]} == expected
    assert manifest["best"].startswith(f"lstm-{best_epoch:02d}-")
    assert manifest["model"]["builder"] == "tests.models:stateful_lstm"
    assert manifest["model"]["trained_batch_size"] == 3
    assert not [f for f in os.listdir(folder) if ".partial-" in f]


@pytest.mark.slow
def test_export_at_batch_1_streams_like_the_training_replica(trained, tmp_path):
    import keras

    from tests.models import sine_streams, stateful_lstm

    out = tmp_path / "lstm.keras"
    run = cli("export", trained.checkpoint_dir, "--batch-size", "1", "--out", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    streaming = keras.models.load_model(out)
    assert streaming.inputs[0].shape[0] == 1

    data = sine_streams(6)
    replica = stateful_lstm(batch_size=3)  # worker 0's replica: streams 0, 1, 2
    best = json.loads(open(f"{trained.checkpoint_dir}/manifest.json").read())["best"]
    replica.load_weights(f"{trained.checkpoint_dir}/{best}")
    x = data["x_train"].reshape(-1, 6, 5, 2)  # [window, stream, time, feature]
    replica_out = np.stack([replica.predict_on_batch(x[t, 0:3])[1] for t in range(len(x))])  # stream 1
    stream_out = np.stack([streaming.predict_on_batch(x[t, 1:2])[0] for t in range(len(x))])
    error = float(np.max(np.abs(replica_out - stream_out)))
    print(f"export: batch-1 stream vs training replica, max abs error {error:.2e}")
    assert error < 1e-5

    same = rayparallel.load_model(trained.checkpoint_dir, batch_size=1)
    assert all(np.array_equal(a, b) for a, b in zip(same.get_weights(), streaming.get_weights(), strict=True))

    # served one step at a time: rebuilt with window=1, the state carries the sequence across calls
    one_step = tmp_path / "one-step.keras"
    run = cli(
        "export", trained.checkpoint_dir, "--batch-size", "1", "--set", "model.kwargs.window=1", "--out", str(one_step)
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"exported {trained.checkpoint_dir}/{best} (the best by val_loss) at batch size 1 with {{'window': 1}}" in (
        run.stdout
    )
    stepping = rayparallel.load_model(trained.checkpoint_dir, batch_size=1, window=1)
    assert tuple(stepping.inputs[0].shape) == (1, 1, 2)
    steps = np.stack(
        [np.concatenate([stepping.predict_on_batch(x[t, 1:2, k : k + 1])[0] for k in range(5)]) for t in range(len(x))]
    )
    error = float(np.max(np.abs(steps - stream_out)))
    print(f"export: window=1 steps vs the window-5 stream, max abs error {error:.2e}")
    assert error < 1e-5


@pytest.mark.slow
def test_export_errors_are_one_line(trained, tmp_path):
    with pytest.raises(
        RayParallelError, match="expected a .weights.h5 file or a checkpoint folder, received .*missing"
    ):
        rayparallel.load_model(tmp_path / "missing")
    corrupt = tmp_path / "c"
    corrupt.mkdir()
    (corrupt / "manifest.json").write_text(open(f"{trained.checkpoint_dir}/manifest.json").read())
    (corrupt / "x.weights.h5").write_bytes(b"not hdf5")
    with pytest.raises(RayParallelError, match=r"expected a weights file that .*manifest.json' lists, received .*x"):
        rayparallel.load_model(corrupt / "x.weights.h5")  # not listed: an earlier run's file, maybe another model
    with pytest.raises(
        RayParallelError, match="expected a Keras .weights.h5 \\(HDF5\\) file, received .*corrupt or not HDF5"
    ):
        rayparallel.load_model(corrupt / "x.weights.h5", unlisted=True)
    manifest = json.loads(open(f"{trained.checkpoint_dir}/manifest.json").read())
    manifest["model"]["kwargs"] = {"units": 9}  # the builder no longer matches the weights
    (corrupt / "manifest.json").write_text(json.dumps(manifest))
    (corrupt / "w.weights.h5").write_bytes(open(trained.final_weights, "rb").read())
    with pytest.raises(RayParallelError, match="expected weights matching the model of tests.models:stateful_lstm"):
        rayparallel.load_model(corrupt / "w.weights.h5", unlisted=True)
    with pytest.raises(
        RayParallelError,
        match=r"model.kwargs: expected arguments that keep the trained weights' shapes, received "
        r"\{'units': 9\}: layer 'lstm",
    ):
        rayparallel.load_model(trained.checkpoint_dir, units=9)
    run = cli("export", trained.checkpoint_dir, "--set", "train.epochs=1", "--out", str(tmp_path / "m.keras"))
    assert run.returncode == 2 and "--set: expected model.kwargs.KEY=VALUE (a builder argument)" in run.stderr
    run = cli("export", str(tmp_path / "missing"), "--out", str(tmp_path / "m.keras"))
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "not found" in run.stderr


@pytest.mark.slow
def test_slow_writes_do_not_hold_the_step_loop(ray_address, tmp_path):
    import ray

    from rayparallel.checkpoint.client import CheckpointClient
    from rayparallel.checkpoint.policy import Saved
    from rayparallel.checkpoint.writer import CheckpointWriter
    from rayparallel.recorder.actor import RunRecorder
    from rayparallel.spec import load_spec
    from tests.models import small_cnn

    class SlowWriter(CheckpointWriter):  # a disk that takes 2 s per file
        def write(self, weights, path):
            time.sleep(2.0)
            super().write(weights, path)

    class SlowRecorder(RunRecorder):
        writer_class = SlowWriter

    spec = load_spec(
        {
            "name": "slow",
            "model": {"builder": "tests.models:small_cnn"},
            "data": {"loader": "tests.models:blobs"},
            "train": {"global_batch_size": 8},
        }
    )
    actor = ray.remote(num_cpus=0, concurrency_groups={"io": 1})(SlowRecorder).remote(
        spec, str(tmp_path), ["."], str(tmp_path / "recorder.json")
    )
    client = CheckpointClient(actor)
    weights = small_cnn().get_weights()

    started = time.perf_counter()
    client.save(weights, Saved("epoch-001.weights.h5", 1, 1, {"loss": 1.0}))
    handed_over = time.perf_counter() - started
    steps_during_write = 0
    while time.perf_counter() - started < 1.0:  # the "training steps" go on
        np.linalg.svd(np.random.rand(64, 64))
        steps_during_write += 1
    assert not (tmp_path / "epoch-001.weights.h5").exists()  # still being written
    client.flush()
    assert (tmp_path / "epoch-001.weights.h5").exists()
    print(
        f"slow writes: save handed over in {handed_over * 1000:.0f} ms, {steps_during_write} steps ran during a 2 s write"
    )
    assert handed_over < 0.5 and steps_during_write > 10

    started = time.perf_counter()  # backpressure: a third save in flight waits for the oldest
    for epoch in (2, 3, 4):
        client.save(weights, Saved(f"epoch-{epoch:03d}.weights.h5", epoch, epoch, {"loss": 1.0}))
    assert time.perf_counter() - started > 1.0
    client.flush()
    ray.kill(actor)


def test_unwritable_checkpoint_dir_fails_before_training(tmp_path):
    import os

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(
        RayParallelError, match=f"checkpoint.dir: expected a writable folder with free space, received '{blocker}"
    ):
        rayparallel.train(
            dict(LSTM, checkpoint={"dir": str(blocker / "ckpt")}), output_dir=tmp_path / "o", verbose=False
        )
    assert blocker.read_text() == "not a folder" and not os.path.exists(tmp_path / "o" / "result.json")


def test_template_with_unknown_metric_fails_before_training(tmp_path):
    spec = dict(LSTM, checkpoint={"filepath": "m-{epoch:02d}-{val_iou:.4f}.weights.h5"})
    with pytest.raises(RayParallelError, match=r"checkpoint.filepath: expected fields among .*received \{val_iou\}"):
        rayparallel.validate(spec)


@pytest.mark.slow
def test_a_full_checkpoint_disk_is_one_line_per_write_and_keeps_every_listed_file(ray_address, tmp_path, capsys):
    """`checkpoint.dir` on a 32 KiB tmpfs: room for epoch 1's file (18 KiB) and the manifest, not one more."""
    import os
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(disk)], check=True)
    try:
        spec = lstm_job("full-disk", "train.epochs=5", "mlflow.enabled=false", f"checkpoint.dir={disk}")
        rayparallel.validate(spec)
        with pytest.raises(RunFailedError) as info:  # the final weights cannot be written either: one line
            rayparallel.train(spec, output_dir=tmp_path / "out")
        printed = capsys.readouterr().out
        room = [line for line in printed.splitlines() if line.startswith("WARNING checkpoint.dir: expected room")]
        assert len(room) == 2 and "(6 files of 18." in room[0] and f"MiB free in {disk}" in room[0], printed[:3000]
        error = str(info.value)
        assert error.startswith(f"checkpoint.dir: expected a writable folder with free space, received '{disk}'")
        assert "No space left on device" in error and "\n" not in error and "Traceback" not in printed
        assert error.endswith(f"; continue with: rayparallel train ... --resume --output-dir {tmp_path / 'out'}")
        warnings = [line for line in printed.splitlines() if line.startswith("WARNING epoch ")]
        assert [line.split(" not saved: ")[0] for line in warnings] == [
            "WARNING epoch 2: epoch-002.weights.h5",
            "WARNING epoch 3: epoch-003.weights.h5",
            "WARNING epoch 4: epoch-004.weights.h5",
            "WARNING epoch 5: epoch-005.weights.h5",
        ], printed[-3000:]  # in epoch order
        assert all("No space left on device" in line and f"MiB free in {disk}" in line for line in warnings)
        assert sorted(os.listdir(disk)) == ["epoch-001.weights.h5", "manifest.json"]  # no partial file left
        listed = [entry["file"] for entry in json.loads((disk / "manifest.json").read_text())["checkpoints"]]
        assert listed == ["epoch-001.weights.h5"]
        model = rayparallel.load_model(str(disk / "epoch-001.weights.h5"), batch_size=1)
        assert np.isfinite(model.predict(np.zeros((1, 5, 2), "float32"), verbose=0)).all()
        assert json.loads((tmp_path / "out" / "run.json").read_text())["status"] == "FAILED"  # resumable
    finally:
        subprocess.run(["umount", str(disk)], check=False)
