"""Failures: a killed worker resumes exactly, a dead peer is detected in bounded time, a NaN
loss stops the run, restarts are explicit (real local Ray, real TF)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

import rayparallel
from rayparallel.errors import RayParallelError, StepTimeoutError
from rayparallel.recorder.actor import recorder_name
from tests.models import lstm_job

from .helpers import final_weights, max_relative_error

pytestmark = pytest.mark.slow

LSTM = lstm_job(
    "fault-lstm",
    "data.kwargs.windows=150",
    "train.epochs=5",
    "train.optimizer.config.learning_rate=0.01",
    "mlflow.enabled=false",
)


def weights_of(result):
    from tests.models import stateful_lstm

    return final_weights(result.final_weights, stateful_lstm)


def kill_when(
    epochs_done: int,
    killed: dict,
    run_prefix: str,
    inside: bool = False,
    sig: int = signal.SIGKILL,
    recorder: bool = False,
) -> threading.Thread:
    """SIGKILL (or `sig`) rank 1 (or the run's recorder) once the live run (its Ray run name begins
    `run_prefix`) finished `epochs_done` epochs; `inside`: and wrote a resume point inside the next epoch."""
    import ray

    prefix = recorder_name(run_prefix)

    def watch():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            names = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix)]
            if names:
                actor = ray.get_actor(names[0]["name"], namespace=names[0]["namespace"])
                summary = ray.get(actor.summary.remote())
                run_folder = Path(ray.get(actor.run_folder.remote()))
                point_inside = any(run_folder.glob(f"epoch-{epochs_done:04d}-step-*/meta.json"))
                if len(summary.history) >= epochs_done and len(summary.workers) == 2 and point_inside >= inside:
                    pid = ray.get(actor.__ray_call__.remote(_pid)) if recorder else summary.workers[1].pid
                    os.kill(pid, sig)
                    killed.update(pid=pid, at=time.monotonic(), after_epoch=len(summary.history))
                    return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _pid(actor) -> int:
    return os.getpid()


@pytest.fixture(scope="module")
def uninterrupted(ray_address, tmp_path_factory):
    return rayparallel.train(LSTM, output_dir=tmp_path_factory.mktemp("plain"), verbose=False)


def test_a_killed_recorder_comes_back_and_a_killed_worker_resumes_to_the_same_weights(uninterrupted, tmp_path):
    """One run, two losses: the recorder's process inside epoch 2 (Ray starts it again, it reads
    back what it had acknowledged), rank 1 inside epoch 3 (the group restarts from the newest step
    point). Nothing the console reported is missing from the folder or from the one MLflow run."""
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path}/mlflow.db"
    spec = dict(
        LSTM,
        name="fault-kill",
        failure={"max_failures": 1},
        run={"resume_every_n_steps": 40},  # 148 steps an epoch: points at steps 24, 64, 104, 144 of epoch 3
        mlflow={"tracking_uri": store, "experiment": "fault"},
    )
    killed, lost = {}, {}
    watchers = [kill_when(1, lost, "fault-kill-", recorder=True), kill_when(2, killed, "fault-kill-", inside=True)]
    result = rayparallel.train(spec, output_dir=tmp_path / "out", verbose=False)
    for watcher in watchers:
        watcher.join(timeout=5)
    assert lost and lost["after_epoch"] == 1, "the recorder was never killed inside epoch 2"
    assert killed, "the worker was never killed"
    assert killed["pid"] not in [w["pid"] for w in result.workers]  # the group was restarted
    restarted = result.workers[0]
    assert restarted["resumed_from_epoch"] == 2 and restarted["resumed_from_step"] > 0  # inside epoch 3
    error = max_relative_error(weights_of(result), weights_of(uninterrupted))
    print(
        f"resume after SIGKILL of rank 1 at epoch 3 step {restarted['resumed_from_step']}+: "
        f"max relative weight error {error:.2e}"
    )
    assert error < 1e-6
    for key in ("loss", "mae", "val_loss"):  # the resumed epoch's figures include the steps before the kill
        assert [h[key] for h in result.history] == pytest.approx([h[key] for h in uninterrupted.history], rel=1e-5)

    manifest = json.loads(open(f"{result.checkpoint_dir}/manifest.json").read())
    assert [c["epoch"] for c in manifest["checkpoints"]] == [1, 2, 3, 4, 5]
    assert all(os.path.exists(f"{result.checkpoint_dir}/{c['file']}") for c in manifest["checkpoints"])
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("fault").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "val_loss")] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["dead", "hung"])
def test_dead_or_hung_peer_is_detected_within_the_timeout(ray_address, tmp_path, sig):
    """A dead peer: Ray sees its process end. A hung one (SIGSTOP: alive, never answering): rayparallel's
    step watchdog fails rank 0 after `run.collective_timeout_s` without a finished step, unless TensorFlow's
    own heartbeat check aborted its collectives first."""
    timeout, name = 15, f"fault-{'dead' if sig == signal.SIGKILL else 'hung'}"
    spec = dict(LSTM, name=name, run={"collective_timeout_s": timeout})
    killed: dict = {}
    watcher = kill_when(1, killed, f"{name}-", sig=sig)
    try:
        with pytest.raises(Exception) as info:
            rayparallel.train(spec, output_dir=tmp_path / "out", verbose=False)
    finally:
        if killed.get("pid") and sig == signal.SIGSTOP:  # Ray ends the group; never leave a stopped process
            with contextlib.suppress(ProcessLookupError):
                os.kill(killed["pid"], signal.SIGKILL)
    detected = time.monotonic() - killed["at"]
    watcher.join(timeout=5)
    print(f"{sig.name} peer: the run failed {detected:.1f}s after it (collective timeout {timeout}s)")
    assert detected < timeout + 20
    if sig == signal.SIGSTOP:  # Ray would wait 10 min (its worker health check) for a process that is alive
        # who notices first depends on where rank 0 waits: in a collective, TensorFlow's heartbeat check or the
        # watchdog's abort; in Ray Train's report barrier, the watchdog ending the process (StepTimeoutError)
        text = str(info.value)
        if info.type is StepTimeoutError:
            assert detected > timeout - 1 and text.startswith("rank 0: run.collective_timeout_s: expected"), text
        else:
            assert "run.collective_timeout_s" in text or "stopped sending heartbeats" in text, text[-2000:]
    else:
        assert "Training failed" in str(info.value) or "died" in str(info.value).lower()
    assert json.loads((tmp_path / "out" / "run.json").read_text())["status"] == "FAILED"


def test_nan_loss_stops_naming_epoch_and_step(ray_address, tmp_path):
    spec = {
        "name": "fault-nan",
        "model": {"builder": "tests.models:cnn_nan_after", "kwargs": {"steps": 15}},
        "data": {"loader": "tests.models:blobs"},
        "train": {
            "global_batch_size": 8,
            "epochs": 3,
            "loss": "sparse_categorical_crossentropy",
            "progress_every_n_steps": 5,
        },
        "scaling": {"num_workers": 2},
        "mlflow": {"enabled": False},
    }
    with pytest.raises(RayParallelError) as info:
        rayparallel.train(spec, output_dir=tmp_path / "out", verbose=False)
    assert str(info.value).startswith("train.on_nan: expected finite losses, received NaN/inf at epoch 2, step 4;")
    files = sorted(f for f in os.listdir(tmp_path / "out" / "checkpoints") if f.endswith(".weights.h5"))
    assert files == ["epoch-001.weights.h5"]  # the last good checkpoint stays the newest


def test_resume_continues_the_same_run_past_a_damaged_point_on_any_worker_count_and_fresh_starts_anew(
    uninterrupted, tmp_path, capsys
):
    """3 epochs, then 5 on 4 workers (2, 2, 1, 1 streams: a count that does not divide the batch) from the
    newest intact resume point: the uninterrupted 2-worker model, in the same MLflow run."""
    out = tmp_path / "out"
    store = f"sqlite:///{tmp_path}/mlflow.db"
    spec = dict(LSTM, name="fault-resume", mlflow={"tracking_uri": store})
    # keeps epoch ends 2 and 3 (num_to_keep 2) and points at steps 54 and 104 of epoch 3 (every 50 global steps)
    first = rayparallel.train(spec, overrides=["train.epochs=3", "run.resume_every_n_steps=50"], output_dir=out)
    with pytest.raises(RayParallelError) as refused:  # a resume continues the recorded job: no other model
        rayparallel.train(spec, overrides=["train.epochs=5", "data.kwargs.windows=10"], output_dir=out, resume=True)
    assert str(refused.value).startswith(
        "--set data.kwargs.windows: expected only settings a resume may change (train.epochs, "
    )
    recorded = json.loads((out / "run.json").read_text())
    folders = Path(recorded["storage_path"]) / recorded["ray_run_name"]
    (folders / "epoch-0003" / "state.npz").write_bytes(b"garbage, as a crash mid-write leaves it")
    capsys.readouterr()
    more = ["train.epochs=5", "scaling.num_workers=4", "scaling.resources_per_worker.CPU=0.5"]
    resumed = rayparallel.train(dict(spec, name="renamed"), overrides=more, output_dir=out, resume=True)
    printed = capsys.readouterr().out
    assert "resuming the job recorded in" in printed and "differs in name" in printed  # the recorded job goes on
    assert "skipped a damaged resume checkpoint, epoch-0003: state.npz does not match its checksum" in printed
    assert "after epoch 2 and 104 steps of epoch 3" in printed and "Traceback" not in printed  # inside an epoch
    ranks = sorted(resumed.workers, key=lambda w: w["rank"])
    assert [w["batch_shape"] for w in ranks] == [[[b, 5, 2]] for b in (2, 2, 1, 1)]
    assert resumed.mlflow["run_id"] == first.mlflow["run_id"]
    assert len(resumed.history) == 5
    manifest = json.loads((out / "checkpoints" / "manifest.json").read_text())
    assert [c["epoch"] for c in manifest["checkpoints"]] == [1, 2, 3, 4, 5]  # the files before the resume too
    error = max_relative_error(weights_of(resumed), weights_of(uninterrupted))
    print(f"resume past a damaged point on 4 workers vs uninterrupted 2: max relative weight error {error:.2e}")
    assert error < 1e-5

    for state in folders.glob("epoch-*/state.npz"):
        state.write_bytes(b"")
    with pytest.raises(RayParallelError) as info:
        rayparallel.train(spec, output_dir=out, resume=True, verbose=False)
    assert str(info.value).startswith("--resume: expected an intact resume checkpoint of run 'fault-resume-")
    assert "received none (epoch-0005: state.npz does not match its checksum" in str(info.value)

    fresh = rayparallel.train(spec, overrides=["train.epochs=1"], output_dir=out, resume=False)
    printed = capsys.readouterr().out
    assert "(fresh)" in printed and fresh.mlflow["run_id"] != first.mlflow["run_id"]
    assert "moved 7 files of an earlier run aside" in printed  # 5 epochs, final, manifest: not beside the new ones
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("*.weights.h5")) == ["epoch-001.weights.h5", "final.weights.h5"]
    (earlier,) = ckpts.glob("earlier-*")
    assert len(list(earlier.glob("epoch-*.weights.h5"))) == 5 and (earlier / "manifest.json").is_file()
    with pytest.raises(RayParallelError, match="--resume: expected a previous run with a saved epoch in"):
        rayparallel.train(spec, output_dir=tmp_path / "empty", resume=True)


def training_cli(job: Path, out: Path, ray_address: str, until: str = "Epoch "):
    """`rayparallel train` in its own process, once a line holds `until` (default: training shows progress);
    and the lines so far. A run that never prints it is ended after 5 minutes."""
    import subprocess
    import sys

    from .helpers import REPO

    cli = subprocess.Popen(
        [sys.executable, "-m", "rayparallel.cli", "train", str(job), "--output-dir", str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "RAY_ADDRESS": ray_address, "PYTHONUNBUFFERED": "1"},
    )
    seen = []
    deadline = threading.Timer(300, cli.kill)
    deadline.start()
    for line in cli.stdout:
        seen.append(line)
        if until in line:  # "Epoch 1/", or a later one when it resumes
            break
    deadline.cancel()
    return cli, seen


def test_a_second_run_is_refused_ctrl_c_ends_the_run_cleanly_and_a_dead_recorder_is_one_line(ray_address, tmp_path):
    import subprocess
    import sys

    import ray
    from mlflow.tracking import MlflowClient

    from .helpers import REPO

    store = f"sqlite:///{tmp_path}/mlflow.db"
    job = tmp_path / "job.yaml"
    long = dict(LSTM, name="fault-sigint", mlflow={"tracking_uri": store}, train=dict(LSTM["train"], epochs=500))
    job.write_text(__import__("yaml").safe_dump(long))
    out = tmp_path / "out"
    cli, seen = training_cli(job, out, ray_address)
    run_json = out / "run.json"  # complete once it names the MLflow run (created after the first step)
    deadline = time.monotonic() + 120
    while json.loads(run_json.read_text())["mlflow_run_id"] is None and time.monotonic() < deadline:
        time.sleep(0.2)
    before = {name: (out / name).read_bytes() for name in ("run.json", "job.yaml")}
    second = subprocess.run(  # the same job again into the live run's folder
        [sys.executable, "-m", "rayparallel.cli", "train", str(job), "--output-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "RAY_ADDRESS": ray_address},
        timeout=300,
    )
    assert second.returncode == 2, second.stderr[-2000:]
    assert second.stderr.strip().startswith("rayparallel: error: --output-dir: expected a folder no live run is")
    assert "held by job 'fault-sigint', pid " in second.stderr and second.stderr.strip().count("\n") == 0
    assert {name: (out / name).read_bytes() for name in before} == before  # nothing changed there
    cli.send_signal(signal.SIGINT)
    rest, _ = cli.communicate(timeout=120)
    output = "".join(seen) + rest
    assert cli.returncode == 130, output[-2000:]
    assert "interrupted; MLflow run marked KILLED; continue with: rayparallel train ... --resume" in output
    assert "Traceback" not in output
    assert json.loads((tmp_path / "out" / "run.json").read_text())["status"] == "KILLED"
    client = MlflowClient(store)
    run = client.search_runs([client.get_experiment_by_name("fault-sigint").experiment_id])[0]
    assert run.info.status == "KILLED"
    time.sleep(2)  # the CLI's driver is gone, and with it every actor it owned
    assert not [
        a
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(recorder_name("fault-sigint"))
    ]

    again, seen = training_cli(job, out, ray_address)  # the run again, its recorder killed while it trains
    name = recorder_name(json.loads((out / "run.json").read_text())["ray_run_name"])
    [entry] = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"] == name]
    ray.kill(ray.get_actor(name, namespace=entry["namespace"]))
    rest, _ = again.communicate(timeout=120)
    output = "".join(seen) + rest
    assert again.returncode == 1, output[-3000:]
    last = output.strip().splitlines()[-1]  # Ray's own reason in the brackets
    assert last.startswith("rayparallel: error: the run's recorder died (") and "ray.kill" in last, output[-3000:]
    assert last.endswith(
        f"); the epochs it saved are kept; continue with: rayparallel train ... --resume --output-dir {out}"
    )
    assert "Traceback" not in output and json.loads((out / "run.json").read_text())["status"] == "FAILED"


def test_a_stalled_run_says_what_it_waits_for_within_a_minute(ray_address, tmp_path):
    """Every worker's input never comes: the console says so (not the silence of a run that waits) after
    `run.stall_warning_s`, again every `run.stall_warning_s`, and Ctrl-C still ends the run cleanly."""
    import yaml

    job = tmp_path / "job.yaml"
    stalled = dict(
        LSTM,
        name="fault-stall",
        data={"loader": "tests.models:sine_streams_shard_that_stalls", "layout": "streams"},
        run={"stall_warning_s": 10},
    )
    job.write_text(yaml.safe_dump(stalled))
    started = time.monotonic()
    cli, seen = training_cli(job, tmp_path / "out", ray_address, until="rank 0 is loading its data")
    warned = time.monotonic() - started
    cli.send_signal(signal.SIGINT)
    rest, _ = cli.communicate(timeout=120)
    line = seen[-1].strip()
    print(f"stalled run: the console said why {warned:.1f} s after the command started: {line}")
    assert warned < 90, "".join(seen)[-3000:]
    assert line.startswith("WARNING no progress for 1") and line.endswith(  # 10 s after rank 0's last phase
        "s: rank 0 is loading its data (a loader's rows, or a dataset's first batch)"
    ), line
    assert cli.returncode == 130 and "Traceback" not in rest, rest[-2000:]


def test_a_dataset_function_that_blocks_is_said_before_any_worker_starts(ray_address, tmp_path):
    """The driver's checks call `data.dataset` (before the worker group): a function that never returns
    is said every `run.stall_warning_s` too, and Ctrl-C ends the command."""
    import yaml

    job = tmp_path / "job.yaml"
    blocked = dict(
        LSTM, name="fault-blocked", data={"dataset": "tests.models:dataset_that_blocks", "kwargs": {"path": "x"}}
    )
    job.write_text(yaml.safe_dump(dict(blocked, run={"stall_warning_s": 5})))
    started = time.monotonic()
    cli, seen = training_cli(job, tmp_path / "out", ray_address, until="WARNING no progress for")
    warned = time.monotonic() - started
    cli.send_signal(signal.SIGINT)
    rest, _ = cli.communicate(timeout=120)
    print(f"blocked dataset function: said {warned:.1f} s after the command started: {seen[-1].strip()}")
    assert warned < 90 and seen[-1].strip().endswith(
        "s: the driver's checks are calling data.dataset and reading its first batch "
        "(Ray Data may be waiting for CPUs beside the workers, or the function blocks)"
    ), "".join(seen)[-3000:]
    assert cli.returncode == 130 and "Traceback" not in rest, rest[-2000:]
