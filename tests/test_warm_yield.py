"""The warm worker group never makes the rest of a session wait: a user's script calls `rayparallel.fit`,
then a Ray task, Ray Data and a Ray Train trainer of its own, and each runs to the end (the group closes in
one line naming what waited); an idle group closes after `RAYPARALLEL_WARM_IDLE_TIMEOUT_S`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .test_fit import MODEL_CELL

SCRIPT = """
import os
import time

import ray
import rayparallel


def fit(folder):
    rayparallel.fit(build, x, y, batch_size=8, epochs=1, shuffle=False, num_workers=2, output_dir=folder,
                    mlflow={"enabled": False})


def timed(label, work):
    started = time.time()
    print(label, work(), f"{time.time() - started:.1f}", flush=True)


fit("first")
timed("TASK1", lambda: ray.get(ray.remote(lambda: "ran").remote()))  # 1 CPU: fits beside the workers
timed("TASK2", lambda: ray.get(ray.remote(num_cpus=2)(lambda: "ran").remote()))  # their CPUs
fit("second")
timed("DATA", lambda: ray.data.range(64).map_batches(lambda b: {"id": b["id"] * 2}, num_cpus=2).sum("id"))
fit("third")

from ray.train import RunConfig, ScalingConfig
from ray.train.tensorflow import TensorflowTrainer


def loop(config):
    import ray.train

    ray.train.report({"rank": ray.train.get_context().get_world_rank()})


trainer = TensorflowTrainer(loop, scaling_config=ScalingConfig(num_workers=2), run_config=RunConfig(storage_path=os.path.abspath("train")))
timed("TRAINER", lambda: trainer.fit().error)
os.environ["RAYPARALLEL_WARM_IDLE_TIMEOUT_S"] = "3"
workers = rayparallel.Workers(num_workers=1)
deadline = time.time() + 180  # the close waits for the group's worker to take its end (after its TensorFlow import)
while "closed" not in repr(workers) and time.time() < deadline:
    time.sleep(0.5)
print("IDLE", workers, flush=True)
"""


@pytest.mark.slow
def test_fit_then_the_users_own_ray_task_data_and_trainer_each_run_to_the_end(tmp_path):
    """As a user's script, with a local Ray of its own (2 cores: 3 CPUs, 2 of them the warm workers')."""
    (tmp_path / "script.py").write_text(MODEL_CELL + SCRIPT)
    env = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", "RAYPARALLEL_WARM_WORKERS")}
    run = subprocess.run(
        [sys.executable, "script.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    out = run.stdout
    assert run.returncode == 0, run.stderr[-3000:] + out[-3000:]
    keeping = [line for line in out.splitlines() if line.startswith("rayparallel: keeping")]
    closing = [line for line in out.splitlines() if line.startswith("rayparallel: closing")]
    kept = "rayparallel: keeping 2 workers (2 CPUs) warm for the next fit or train; rayparallel.shutdown() frees them"
    assert [line.split(" (so do", 1)[0] for line in keeping] == [kept] * 3, keeping
    waited = "rayparallel: closing the warm workers (2 workers): {} waited for them"
    assert closing[:3] == [
        waited.format("a Ray task or actor asking for 1 x {'CPU': 2}"),
        waited.format("a Ray task or actor asking for 1 x {'CPU': 2}"),
        waited.format("a placement group (a Ray Train or Tune worker group) asking for 2 x {'CPU': 1}"),
    ], closing
    idle = "rayparallel: closing the warm workers (1 worker): idle for "
    assert len(closing) == 4 and closing[3].startswith(idle), closing
    assert closing[3].endswith(" s (RAYPARALLEL_WARM_IDLE_TIMEOUT_S)"), closing
    ran = {
        line.split()[0]: line.split()[1:]
        for line in out.splitlines()
        if line.split()[:1] in (["TASK1"], ["TASK2"], ["DATA"], ["TRAINER"], ["IDLE"])
    }
    assert ran["TASK1"][0] == ran["TASK2"][0] == "ran" and ran["DATA"][0] == str(sum(range(64)) * 2)
    assert ran["TRAINER"][0] == "None" and " ".join(ran["IDLE"]) == "Workers(1 worker, closed)"
    print({label: float(words[-1]) for label, words in ran.items() if label != "IDLE"}, "s each, the yield included")


def test_what_waits_is_named_only_when_it_asks_for_what_the_group_holds():
    from ray.autoscaler.v2.schema import (
        PlacementGroupResourceDemand,
        RayTaskActorDemand,
        ResourceDemandSummary,
        ResourceRequestByCount,
    )

    from rayparallel.cluster.pending_demands import waiting_for

    def task(**bundle):
        return RayTaskActorDemand([ResourceRequestByCount(bundle, 1)])

    group = PlacementGroupResourceDemand([ResourceRequestByCount({"CPU": 1.0, "GPU": 0.5}, 2)], details="")
    assert waiting_for({"CPU": 2.0}, ResourceDemandSummary()) is None
    assert waiting_for({"CPU": 2.0}, ResourceDemandSummary(ray_task_actor_demand=[task(GPU=1.0)])) is None
    assert waiting_for({"GPU": 2.0}, ResourceDemandSummary(ray_task_actor_demand=[task(GPU=1.0)])) == (
        "a Ray task or actor asking for 1 x {'GPU': 1}"
    )
    both = ResourceDemandSummary(placement_group_demand=[group], ray_task_actor_demand=[task(CPU=1.0)])
    assert waiting_for({"CPU": 2.0}, both) == (
        "a placement group (a Ray Train or Tune worker group) asking for 2 x {'CPU': 1, 'GPU': 0.5}"
    )


@pytest.mark.parametrize("given", ["0", "-5", "ten", "nan"])
def test_a_bad_idle_timeout_is_one_line(given, monkeypatch):
    from rayparallel.cluster.warm_workers import idle_timeout_s
    from rayparallel.errors import RayParallelError

    monkeypatch.setenv("RAYPARALLEL_WARM_IDLE_TIMEOUT_S", given)
    with pytest.raises(RayParallelError) as info:
        idle_timeout_s()
    assert (
        str(info.value) == f"RAYPARALLEL_WARM_IDLE_TIMEOUT_S: expected a positive number of seconds, received {given!r}"
    )
