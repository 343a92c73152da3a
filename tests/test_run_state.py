"""The output folder: one live run at a time, never stuck after a killed driver; what a resume runs (no Ray)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from rayparallel.cluster.run_state import LOCK_FILE, folder_held
from rayparallel.errors import RayParallelError

from .helpers import REPO

HOLDER = """
import sys, time
from pathlib import Path
from rayparallel.cluster.run_state import folder_held
with folder_held(Path(sys.argv[1]), "first-job"):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_live_run_holds_its_folder_and_a_killed_one_leaves_it_free(tmp_path):
    driver = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert driver.stdout.readline().strip() == "held"
        with pytest.raises(RayParallelError) as info:
            with folder_held(tmp_path, "second-job"):
                pass
        text = str(info.value)
        assert text.startswith(f"--output-dir: expected a folder no live run is writing to, received '{tmp_path}'")
        assert f"held by job 'first-job', pid {driver.pid} on " in text and "\n" not in text
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    started = time.monotonic()
    with folder_held(tmp_path, "second-job"):  # the kernel released the dead driver's lock
        assert "second-job" in (tmp_path / LOCK_FILE).read_text()
    assert time.monotonic() - started < 1


def test_a_resume_plan_runs_the_recorded_job_and_refuses_only_real_changes(tmp_path):
    import numpy as np
    import yaml

    from rayparallel.checkpoint import resume_state
    from rayparallel.cluster.run_state import RunState, plan_run
    from rayparallel.spec import load_spec

    out = tmp_path / "out"
    requested = load_spec(REPO / "jobs" / "stateful_lstm.yaml", [f"checkpoint.dir={tmp_path / 'ckpt'}"])
    fresh = plan_run(requested, [], out, None)
    assert fresh.point is None and fresh.spec is requested and fresh.state.ray_run_name.startswith("stateful-lstm-")

    out.mkdir()
    (out / "job.yaml").write_text(yaml.safe_dump(requested.to_dict(), sort_keys=False))
    RunState("stateful-lstm-1", str(tmp_path / "ray"), status="KILLED").save(out)
    meta = {"epoch": 2, "weights": 1, "optimizer": 1}
    resume_state.write_state_atomically(
        tmp_path / "ray" / "stateful-lstm-1", "epoch-0002", {"w0": np.zeros(2), "o0": np.zeros(1)}, meta
    )

    same = [f"checkpoint.dir={tmp_path / 'ckpt'}", "train.epochs=9"]  # one unchanged, one a resume may change
    plan = plan_run(load_spec(requested, same), same, out, None)  # unfinished: resumes
    assert (plan.state.ray_run_name, plan.state.status, plan.point.epoch) == ("stateful-lstm-1", "RUNNING", 2)
    assert plan.spec.train.epochs == 9 and plan.changed == []  # the recorded job reads back as it was given
    renamed = plan_run(load_spec(requested, ["name=other"]), [], out, True)
    assert renamed.spec.name == requested.name and renamed.changed == ["name"]
    with pytest.raises(RayParallelError) as refused:
        plan_run(requested, ["checkpoint.dir=elsewhere", "train.epochs=9"], out, True)
    assert str(refused.value).startswith("--set checkpoint.dir: expected only settings a resume may change (")
    assert plan_run(requested, [], out, False).point is None  # --fresh
