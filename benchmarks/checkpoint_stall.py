"""How long rank 0 is blocked per checkpoint: the recorder actor against a synchronous save.

Run: python -m benchmarks.checkpoint_stall [--repeats 5] [--log-checkpoints]

`--log-checkpoints` records the run in a temporary MLflow store with `mlflow.log_checkpoints:
true`, so the recorder also logs every file as an MLflow logged model: the stall must not grow.

Blocked time for the actor path = what the training loop itself does per checkpoint: a
snapshot of the weights (`worker.resume.snapshot`) and `CheckpointClient.save`, which
returns at once; the NumPy copy, the object-store copy and the write happen in a
background thread and in the actor while training goes on.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def measure(repeats: int = 5, full_save: bool = False, log_checkpoints: bool = False) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import ray

    from benchmarks.models import dense_50m
    from rayparallel.checkpoint.client import CheckpointClient
    from rayparallel.checkpoint.policy import Saved
    from rayparallel.recorder.actor import RecorderActor
    from rayparallel.spec import load_spec
    from rayparallel.worker.resume import snapshot

    model = dense_50m()
    params = model.count_params()
    folder = Path(tempfile.mkdtemp(prefix="rayparallel-bench-"))
    job = {
        "name": "bench",
        "model": {"builder": "benchmarks.models:dense_50m"},
        "data": {"loader": "benchmarks.models:none"},
        "train": {"global_batch_size": 1},
    }
    if log_checkpoints:
        job["mlflow"] = {"tracking_uri": f"sqlite:///{folder}/mlflow.db", "log_checkpoints": True}
    spec = load_spec(job)
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    tracking = _tracking(folder) if log_checkpoints else None
    actor = RecorderActor.remote(spec, str(folder / "actor"), [os.getcwd()], str(folder / "recorder.json"), tracking)
    actor.mark_phase.remote("first_step_done", time.time())  # the MLflow run is created now
    client = CheckpointClient(actor)
    client.save(model.get_weights(), Saved("warm-up.weights.h5", 0, 0, {}))  # warm-up: the actor builds its model once
    client.flush()

    sync, actor_blocked, actor_write, full = [], [], [], []
    for i in range(1, repeats + 1):
        t = time.perf_counter()
        model.save_weights(str(folder / f"sync-{i}.weights.h5"))
        sync.append(time.perf_counter() - t)

        actor.end_epoch.remote(i, {"loss": 1.0 / i}, 1.0)  # a logged model waits for its epoch's figures
        t = time.perf_counter()
        client.save(snapshot(model.weights), Saved(f"epoch-{i:03d}.weights.h5", i, i, {}))
        actor_blocked.append(time.perf_counter() - t)
        client.flush()
        actor_write.append(time.perf_counter() - t)

        if full_save:  # what Ray's ReportCheckpointCallback does, on every rank
            t = time.perf_counter()
            model.save(str(folder / f"full-{i}.keras"))
            full.append(time.perf_counter() - t)
    logged = _logged_models(tracking, repeats) if tracking else None
    ray.kill(actor)
    shutil.rmtree(folder, ignore_errors=True)
    if started_ray:
        ray.shutdown()
    figures = {
        "parameters": params,
        "sync_save_weights_s": statistics.median(sync),
        "actor_blocked_s": statistics.median(actor_blocked),
        "actor_blocked_spread_s": [min(actor_blocked), max(actor_blocked)],
        "sync_spread_s": [min(sync), max(sync)],
        "actor_write_total_s": statistics.median(actor_write),
    }
    figures["stall_vs_sync_save"] = figures["actor_blocked_s"] / figures["sync_save_weights_s"]
    if full:
        figures["full_save_s"] = statistics.median(full)
    if logged:
        figures["logged_models"] = logged
    return figures


def _tracking(folder: Path):
    from rayparallel.tracking.mlflow_run import TrackingSettings

    uri = f"sqlite:///{folder}/mlflow.db"
    return TrackingSettings(uri, "bench", "bench", folder / "unlogged.json", started_at=time.time())


def _logged_models(tracking, expected: int, timeout: float = 120) -> int:
    """How many checkpoints the recorder's delivery thread logged as models (waits for all, up to `timeout`)."""
    from mlflow.tracking import MlflowClient

    print(f"waiting for the recorder to log the {expected} checkpoints as MLflow models (up to {timeout:.0f} s)")
    client = MlflowClient(tracking.tracking_uri)
    experiment = client.get_experiment_by_name(tracking.experiment).experiment_id
    deadline, found = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        found = len(client.search_logged_models([experiment]))
        if found >= expected:
            break
        time.sleep(0.5)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--log-checkpoints", action="store_true")
    args = parser.parse_args()
    f = measure(args.repeats, log_checkpoints=args.log_checkpoints)
    print(f"model: {f['parameters'] / 1e6:.1f}M parameters ({f['parameters'] * 4 / 2**20:.0f} MiB float32)")
    print(
        f"synchronous model.save_weights: {f['sync_save_weights_s'] * 1000:.0f} ms median "
        f"(range {f['sync_spread_s'][0] * 1000:.0f}-{f['sync_spread_s'][1] * 1000:.0f})"
    )
    print(
        f"rank 0 blocked with the checkpoint actor: {f['actor_blocked_s'] * 1000:.0f} ms median "
        f"(range {f['actor_blocked_spread_s'][0] * 1000:.0f}-{f['actor_blocked_spread_s'][1] * 1000:.0f}); "
        f"the actor's write took {f['actor_write_total_s'] * 1000:.0f} ms in the background"
    )
    print(f"stall vs synchronous save: {f['stall_vs_sync_save']:.2f}")
    if "logged_models" in f:
        print(f"MLflow logged models of the checkpoints (mlflow.log_checkpoints): {f['logged_models']}")


if __name__ == "__main__":
    main()
