"""`rayparallel tune` on the session's local Ray: every trial a whole run, ASHA stopping bad
ones, one MLflow parent with a child per trial (a real `mlflow server`), and a resumed sweep."""

from __future__ import annotations

import csv
import json
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

import rayparallel
from tests.models import lstm_job, ray_data_job, write_sine_streams

from .helpers import RAYPARALLEL, REPO, cli, cli_env, doc_section

pytestmark = pytest.mark.slow

LEARNING_RATES = "grid(0.03, 0.000001, 0.01, 0.000002)"  # good, hopeless, good, hopeless: ASHA must stop one


def write_job(folder, job: dict):
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def rows(out) -> list[dict]:
    with open(out / "tune_results.csv") as handle:
        return list(csv.DictReader(handle))


def test_asha_sweep_one_parent_run_a_child_per_trial_best_exported(ray_address, mlflow_server, tmp_path):
    from mlflow.tracking import MlflowClient

    job = lstm_job("tune-asha", "scaling.num_workers=1", "train.epochs=6", "data.kwargs.windows=200")
    job["mlflow"] = {
        "tracking_uri": mlflow_server.uri,
        "experiment": "rp-tune",
        "register_model": "rp-tune-best",
        "log_checkpoints": True,
    }
    job["tune"] = {"params": {"train.optimizer.config.learning_rate": LEARNING_RATES}, "grace_period": 1}
    out = tmp_path / "sweep"
    sets = ["--scheduler", "asha", "--set", "tune.reduction_factor=2", "--max-concurrent", "2"]
    run = cli("tune", str(write_job(tmp_path, job)), *sets, "--output-dir", str(out), env={"RAY_ADDRESS": ray_address})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    table = rows(out)
    assert [r["trial"] for r in table] == ["trial-000", "trial-001", "trial-002", "trial-003"]
    assert all(r["status"] == "FINISHED" for r in table), table
    stopped = [r for r in table if r["stopped_early"] == "True"]
    assert stopped and all(int(r["epochs"]) < 6 for r in stopped), table
    assert "STOPPED EARLY" in run.stdout and "trial-001: epoch 1: loss:" in run.stdout
    best = min(table, key=lambda r: float(r["best_val_loss"]))
    assert best["overrides"] in (
        "train.optimizer.config.learning_rate=0.03",
        "train.optimizer.config.learning_rate=0.01",
    )
    assert f"best: {best['trial']}, val_loss" in run.stdout

    client = MlflowClient(mlflow_server.uri)
    experiment = client.get_experiment_by_name("rp-tune")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and len(runs) == 5
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.data.tags["rayparallel.best_trial"] == best["trial"]
    assert parent.data.params["tune.params.train.optimizer.config.learning_rate"] == LEARNING_RATES
    assert parent.data.params["tune.scheduler"] == "asha" and parent.data.params["tune.metric"] == "val_loss"
    assert parent.data.metrics["val_loss"] == pytest.approx(
        json.loads((out / best["trial"] / "result.json").read_text())["history"][-1]["val_loss"]
    )
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert sorted(children) == [r["trial"] for r in table]
    for row in table:
        child = children[row["trial"]]
        result = json.loads((out / row["trial"] / "result.json").read_text())
        assert (
            child.info.status == "FINISHED" and child.info.run_id == row["mlflow_run_id"] == result["mlflow"]["run_id"]
        )
        for key in ("loss", "mae", "val_loss", "val_mae"):
            logged = sorted((m.step, m.value) for m in client.get_metric_history(child.info.run_id, key))
            assert logged == [(e, pytest.approx(h[key])) for e, h in enumerate(result["history"], start=1)]
        assert ("rayparallel.stopped_early" in child.data.tags) == (row["stopped_early"] == "True")
        assert child.data.tags.get("rayparallel.best_trial") == ("true" if row is best else None)
        (node,) = {w["node_id"][:8] for w in result["workers"]}  # each child its own System Metrics and models
        assert f"system/{node}/cpu_utilization_percentage" in child.data.metrics, sorted(child.data.metrics)
        models = client.search_logged_models(
            [experiment.experiment_id], filter_string=f"source_run_id = '{child.info.run_id}'"
        )
        kept = sorted(p.name.removesuffix(".weights.h5") for p in Path(result["final_weights"]).parent.glob("epoch-*"))
        assert sorted(m.name for m in models if m.name != "model") == kept, (row["trial"], kept)
    versions = client.search_model_versions("name='rp-tune-best'")
    assert [v.run_id for v in versions] == [parent.info.run_id]  # only the parent registers, once
    assert client.get_model_version_by_alias("rp-tune-best", "champion").version == versions[0].version

    model = rayparallel.load_model(best["final_weights"], batch_size=1)
    prediction = model.predict(np.zeros((1, 5, 2), "float32"), verbose=0)
    assert prediction.shape == (1, 5, 1) and np.isfinite(prediction).all()


def test_the_sweeps_page_runs_and_resumes_as_written(ray_address, tmp_path):
    """docs/sweeps.md typed in a fresh folder holding `jobs/`: its sweep, interrupted (SIGINT, as Ctrl-C)
    once its first trial finished, then resumed by its Python block, which runs only the other trial."""
    folder = tmp_path / "work"
    shutil.copytree(REPO / "jobs", folder / "jobs")
    page = doc_section("Sweeps", "docs/sweeps.md")
    command = shlex.split(page.split("```bash\n")[1].split("```")[0])
    script = tmp_path / "resume_sweep.py"
    script.write_text(page.split("```python\n")[1].split("```")[0])
    env = cli_env({"RAY_ADDRESS": ray_address, "MLFLOW_TRACKING_URI": ""})  # MLflow's default store: folder/mlflow.db
    out = folder / "runs/stateful-lstm-co2-tune"
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen([RAYPARALLEL, *command[1:]], cwd=folder, stdout=log, stderr=log, env=env)
        finished = _wait_finished(out, first, count=1)  # the second trial is starting or training
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=120) == 130
    assert finished == ["trial-000"], (tmp_path / "first.log").read_text()[-3000:]
    kept = {trial: (out / trial / "result.json").stat().st_mtime_ns for trial in finished}

    again = subprocess.run([sys.executable, str(script)], cwd=folder, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "1 of 2 trials finished before; running the other 1" in again.stdout
    assert {trial: (out / trial / "result.json").stat().st_mtime_ns for trial in finished} == kept  # not rerun
    started = {line.split(":")[0] for line in again.stdout.splitlines() if ": started, " in line}
    assert started == {"trial-001"}
    table = rows(out)
    assert [r["status"] for r in table] == ["FINISHED"] * 2
    assert "model.kwargs.units=16" in table[0]["overrides"] and "model.kwargs.units=32" in table[1]["overrides"]
    best = min(table, key=lambda r: float(r["best_val_loss"]))
    printed = again.stdout.splitlines()[-1]  # the block's print: the best trial, its val_loss, the statuses
    assert printed.startswith(f"{best['trial']} ") and printed.endswith(" ['FINISHED', 'FINISHED']"), printed

    from mlflow.tracking import MlflowClient

    plan = json.loads((out / "tune.json").read_text())
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    parent = client.get_run(plan["mlflow_parent_run_id"])
    assert parent.info.status == "FINISHED"
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"
    )
    finished_children = sorted(r.info.run_name for r in children if r.info.status == "FINISHED")
    assert finished_children == ["trial-000", "trial-001"]
    assert all(r.info.status in ("FINISHED", "KILLED") for r in children)  # a trial that started over: KILLED


def test_sweep_bad_input_is_one_line_before_any_trial(ray_address, tmp_path):
    job = lstm_job("tune-bad", "scaling.num_workers=1")
    out = tmp_path / "out"
    lr = "train.optimizer.config.learning_rate"
    run = cli("tune", write_job(tmp_path, job), "--param", "lr", "--output-dir", str(out))
    assert run.returncode == 2 and run.stderr.strip().splitlines() == [
        "rayparallel: error: --param: expected KEY=SPACE, e.g. model.kwargs.units=choice(16,32), received 'lr'"
    ]
    cases = [
        ({lr: "normal(0, 1)"}, {}, f"--param {lr}: expected FUNCTION(ARGS)"),
        ({lr: "loguniform(0, 1)"}, {}, f"--param {lr}: expected loguniform(lo, hi) with two numbers lo < hi"),
        ({"train.lerning_rate": "choice(1, 2)"}, {}, "train.lerning_rate: unknown key"),
        ({"model.kwargs.units": "grid(2, 3)"}, {"samples": 2}, "--samples: expected 1 for a sweep of grid"),
        ({"model.kwargs.units": "grid(2, 3)"}, {"metric": "accuracy"}, "--metric: expected one of the figures"),
        ({"model.kwargs.units": "grid(2, 3)"}, {"mode": "best"}, "tune.mode: expected one of"),
        # on the session's Ray (no RAY_ADDRESS: a cluster that does not grow), what fits is checked
        ({"scaling.num_workers": "grid(1, 6)"}, {}, "trial-001: scaling: expected the cluster to have 6 CPU"),
        ({"scaling.num_workers": "grid(1, 2)"}, {"max_concurrent": 3}, "--max-concurrent: expected at most 2 trials"),
    ]
    for params, settings, message in cases:
        with pytest.raises(rayparallel.RayParallelError) as error:
            rayparallel.tune(job, params=params, output_dir=out, verbose=False, **settings)
        assert message in str(error.value) and "\n" not in str(error.value), (params, settings, str(error.value))
    assert not (out / "tune.json").exists()


def test_a_ray_data_sweep_checks_and_trains_every_trial_through_ray_data(ray_address, tmp_path):
    """Each trial counts and reads its streams with Ray Data tasks beside its two workers (never
    inside the trial's placement group, which holds no CPU for them); the job is checked through
    the cluster first. On the session's Ray: with a second local Ray beside it, its first trial
    failed once in CI, its error not kept (the assertion now shows it)."""
    root = tmp_path / "streams"
    write_sine_streams(root, 6)
    job = ray_data_job("tune-raydata", root, "scaling.num_workers=2")
    job["tune"] = {"params": {"model.kwargs.units": "grid(3)"}}  # one trial: what any trial does
    out = tmp_path / "sweep"
    run = cli("tune", str(write_job(tmp_path, job)), "--output-dir", str(out), env={"RAY_ADDRESS": ray_address})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    table = rows(out)
    assert [(r["trial"], r["status"]) for r in table] == [("trial-000", "FINISHED")], (
        [r["error"] for r in table],
        run.stdout[-3000:],
    )
    result = json.loads((out / "trial-000" / "result.json").read_text())
    assert len(result["workers"]) == 2 and np.isfinite(result["history"][-1]["val_loss"]), result


def _wait_finished(out, process, count: int, timeout: float = 600) -> list[str]:
    """The trials whose run.json says FINISHED, once `count` of them do (or the sweep ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        done = sorted(
            f.parent.name for f in out.glob("trial-*/run.json") if json.loads(f.read_text())["status"] == "FINISHED"
        )
        if len(done) >= count:
            return done
        time.sleep(0.2)
    return []
