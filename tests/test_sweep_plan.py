"""A sweep's plan: spaces as written, the trials they expand to, the results table. Pure logic."""

from __future__ import annotations

import csv
import json

import pytest

from rayparallel import load_spec
from rayparallel.errors import SpecError
from rayparallel.spec import apply_overrides, load_yaml
from rayparallel.tuning.outcomes import best_outcome, format_table, read_outcome, write_csv
from rayparallel.tuning.space import Trial, parse_space, plan_trials
from tests.models import LSTM_JOB


def spaces(**texts):
    return {key.replace("__", "."): parse_space(key, text) for key, text in texts.items()}


def test_spaces_read_as_written_with_numbers_as_numbers():
    assert parse_space("k", "choice(16, 32)").args == (16, 32)
    assert parse_space("k", "grid(adam, sgd)").args == ("adam", "sgd")
    assert parse_space("k", " loguniform( 1e-4 , 1e-1 ) ").args == (1e-4, 0.1)
    assert parse_space("k", "uniform(-1, 0.5)").args == (-1, 0.5)
    assert parse_space("k", "randint(1, 5)").args == (1, 5)
    assert load_yaml("lr: 1e-4")["lr"] == 1e-4  # YAML 1.1 would read the string "1e-4"
    assert apply_overrides({}, ["train.lr=3e-3"]) == {"train": {"lr": 0.003}}


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "normal(0, 1)",
            "expected FUNCTION(ARGS) with FUNCTION one of choice, grid, uniform, loguniform, randint, received 'normal'",
        ),
        ("0.1", "expected FUNCTION(ARGS)"),
        ("uniform(1)", "expected uniform(lo, hi) with two numbers lo < hi, received 'uniform(1)'"),
        ("uniform(2, 1)", "expected uniform(lo, hi) with two numbers lo < hi"),
        ("loguniform(0, 1)", "with lo > 0, received 'loguniform(0, 1)'"),
        ("randint(1, 2.5)", "expected randint(lo, hi) with two integers lo < hi"),
        ("uniform(a, b)", "two numbers"),
        ("choice()", "expected at least one value in choice(...)"),
        ("choice([1, 2)", "expected comma-separated YAML values"),
    ],
)
def test_bad_spaces_are_one_line(text, message):
    with pytest.raises(SpecError) as error:
        parse_space("train.epochs", text)
    assert str(error.value).startswith("--param train.epochs: ") and message in str(error.value)
    assert "\n" not in str(error.value)


def test_grid_points_repeat_per_sample_and_draws_follow_the_seed():
    plan = spaces(model__kwargs__units="grid(8, 16)", train__optimizer__config__learning_rate="loguniform(1e-4, 1e-1)")
    trials = plan_trials(plan, 3, seed=5)
    assert [t.id for t in trials] == [f"trial-00{i}" for i in range(6)]
    assert [t.params["model.kwargs.units"] for t in trials] == [8, 16] * 3
    rates = [t.params["train.optimizer.config.learning_rate"] for t in trials]
    assert all(1e-4 <= r <= 1e-1 for r in rates) and len(set(rates)) == 6
    assert plan_trials(plan, 3, seed=5) == trials and plan_trials(plan, 3, seed=6) != trials
    ints = plan_trials(spaces(k="randint(0, 3)"), 40, seed=0)
    assert {t.params["k"] for t in ints} == {0, 1, 2}  # the upper bound is excluded, as in tune.randint


def test_sample_counts_that_contradict_a_grid_or_nothing_to_sweep_are_refused():
    with pytest.raises(SpecError, match=r"--samples: expected 1 for a sweep of grid spaces only \(4 trials"):
        plan_trials(spaces(a="grid(1, 2)", b="grid(x, y)"), 3, seed=0)
    assert len(plan_trials(spaces(a="grid(1, 2)", b="grid(x, y)"), 1, seed=0)) == 4
    with pytest.raises(SpecError, match="--samples: expected a positive integer, received 0"):
        plan_trials(spaces(a="uniform(0, 1)"), 0, seed=0)
    with pytest.raises(SpecError, match="tune.params: expected at least one KEY=SPACE"):
        plan_trials({}, None, seed=0)


def test_trial_overrides_are_set_values_that_read_back_the_same():
    trial = Trial("trial-000", {"a.lr": 1e-6, "a.opt": "adam", "a.units": 16, "a.flag": "yes", "a.n": "16"})
    assert trial.overrides == ["a.lr=1e-06", "a.opt=adam", "a.units=16", 'a.flag="yes"', 'a.n="16"']
    assert apply_overrides({}, trial.overrides)["a"] == {
        "lr": 1e-6,
        "opt": "adam",
        "units": 16,
        "flag": "yes",
        "n": "16",
    }


def test_tune_section_is_checked_with_the_job():
    job = dict(LSTM_JOB, tune={"params": {"model.kwargs.units": "choice(4, 8)"}, "scheduler": "asha"})
    spec = load_spec(job)
    assert spec.tune.scheduler == "asha" and spec.tune.samples is None and spec.tune.reduction_factor == 4
    for override, message in [
        ("tune.scheduler=pbt", "tune.scheduler: expected one of"),
        ("tune.samples=0", "tune.samples: expected a positive number, received 0"),
        ("tune.reduction_factor=1", "tune.reduction_factor: expected a number above 1, received 1"),
        ("tune.metrc=loss", "did you mean 'tune.metric'"),
    ]:
        with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(".", r"\.")):
            load_spec(job, [override])


def test_outcomes_table_and_csv_from_trial_folders(tmp_path):
    trials = plan_trials(spaces(lr="grid(0.1, 0.01, 0.001)"), None, seed=0)
    histories = {"trial-000": [0.5, 0.3], "trial-001": [0.4, 0.2, 0.25]}
    for trial in trials[:2]:
        folder = tmp_path / trial.id
        folder.mkdir()
        (folder / "run.json").write_text(
            json.dumps({"ray_run_name": trial.id, "storage_path": str(folder), "status": "FINISHED"})
        )
        result = {
            "history": [{"loss": 1.0, "val_loss": v} for v in histories[trial.id]],
            "final_weights": str(folder / "final.weights.h5"),
            "mlflow": {"run_id": f"run-{trial.id}"},
            "stopped": {"epoch": 2, "reason": "stopped by Ray Tune's asha scheduler"}
            if trial.id == "trial-000"
            else None,
        }
        (folder / "result.json").write_text(json.dumps(result))
    outcomes = [read_outcome(t, tmp_path / t.id, "val_loss", "min") for t in trials]
    assert [o.status for o in outcomes] == ["FINISHED", "FINISHED", "PENDING"]
    assert [o.best for o in outcomes] == [0.3, 0.2, None]
    best = best_outcome(outcomes, "min")
    assert best.trial.id == "trial-001" and best_outcome(outcomes, "max").trial.id == "trial-000"
    failed = read_outcome(trials[2], tmp_path / trials[2].id, "val_loss", "min", error="units: expected ...")
    assert failed.status == "FAILED" and failed.error == "units: expected ..."
    table = format_table(outcomes, "val_loss", best).splitlines()
    assert table[0].split() == ["trial", "status", "epochs", "best", "val_loss", "overrides"]
    assert table[1].split()[:4] == ["trial-000", "STOPPED", "EARLY", "2"]
    assert table[2].split()[:5] == ["*", "trial-001", "FINISHED", "3", "0.2"]
    rows = list(csv.DictReader(open(write_csv(outcomes, tmp_path / "tune_results.csv", "val_loss"))))
    assert [r["trial"] for r in rows] == ["trial-000", "trial-001", "trial-002"]
    assert (
        rows[0]["stopped_early"] == "True" and rows[1]["best_val_loss"] == "0.2" and rows[1]["overrides"] == "lr=0.01"
    )
    assert rows[1]["mlflow_run_id"] == "run-trial-001" and rows[2]["status"] == "PENDING"


def test_a_trial_error_from_ray_is_the_users_one_line():
    from ray.exceptions import RayTaskError

    from rayparallel.errors import DataError, user_error

    try:
        raise DataError("data.dataset: expected a dataset that reads, received OSError: gone")
    except DataError as exc:  # as a Tune trial's error arrives: Ray's task error posing as its cause's class
        arrived = RayTaskError("ResourceTrainable.train", "Traceback (most recent call last): ...", exc)
        arrived = arrived.as_instanceof_cause()
    assert isinstance(arrived, DataError) and not str(arrived).startswith("data.dataset")  # Ray's header first
    assert str(user_error(arrived, "")) == "data.dataset: expected a dataset that reads, received OSError: gone"
