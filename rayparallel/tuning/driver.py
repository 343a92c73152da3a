"""A sweep from its plan to its results: trials checked, Ray Tune run, table, MLflow parent.

Order matters: every check that can refuse the sweep (spaces, keys, the metric, what fits
the cluster) runs before the MLflow parent run or any trial exists, and the plan
(`tune.json`) is written before Tune starts, so an interrupted sweep resumes with the same
trials and the same parent run.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..cluster.run import checked_job, needs_ray_for_checks, ray_session
from ..console import interrupted, printer
from ..errors import RayParallelError, SpecError, first_line
from ..files import atomic_write_text
from ..hooks import env_defaults
from ..spec import JobSpec, load_spec
from ..spec.schema import TuneSpec
from .outcomes import TrialOutcome, best_outcome, format_table, read_outcome, write_csv
from .result import SweepResult
from .space import Trial, parse_space, plan_trials

if TYPE_CHECKING:
    from ..tracking.sweep_run import SweepRun

PLAN_FILE = "tune.json"
RESULTS_FILE = "tune_results.csv"


@dataclass
class TrialPlan:
    """`tune.json`: the sweep's settings and trials, fixed when it starts."""

    settings: dict  # TuneSpec fields, resolved (metric chosen)
    trials: list[dict]  # {"id", "params"}
    mlflow_parent_run_id: str | None = None

    def trial_list(self) -> list[Trial]:
        return [Trial(t["id"], t["params"]) for t in self.trials]

    def save(self, folder: Path) -> None:
        atomic_write_text(folder / PLAN_FILE, json.dumps(asdict(self), indent=2), "--output-dir")

    @classmethod
    def read(cls, folder: Path) -> TrialPlan:
        path = folder / PLAN_FILE
        if not path.is_file():
            raise RayParallelError(
                f"--resume: expected a sweep recorded in {str(path)!r}, received none; start it without --resume"
            )
        return cls(**json.loads(path.read_text()))


def run_sweep(
    job: JobSpec,
    settings: TuneSpec,
    output_dir: Path,
    *,
    resume: bool = False,
    verbose: bool = True,
    worker_logs: bool = False,
) -> SweepResult:
    say = printer(verbose)
    if resume:
        plan = TrialPlan.read(output_dir)
        settings = TuneSpec(**plan.settings)
        say(f"rayparallel: resuming the sweep recorded in {output_dir / PLAN_FILE}")
    else:
        spaces = {key: parse_space(key, text) for key, text in settings.params.items()}
        plan = TrialPlan(asdict(settings), [asdict(t) for t in plan_trials(spaces, settings.samples, settings.seed)])
    trials = plan.trial_list()
    jobs = {t.id: trial_job(job, t) for t in trials}  # every trial's spec checked before any starts
    first = jobs[trials[0].id]
    checked = None if needs_ray_for_checks(first) else _checked_metric(settings, first)  # see needs_ray_for_checks
    # the trials' Ray, which a Ray Data job's checks read through; MLflow's client fails fast (the parent run's too)
    with ray_session(job, worker_logs) as whole_cluster, env_defaults("mlflow"):
        metric, keys = checked or _checked_metric(settings, first)
        plan.settings = asdict(replace(settings, metric=metric))
        concurrent = _concurrency(jobs, settings.max_concurrent, checked=whole_cluster)
        parent = _parent_run(job, plan.mlflow_parent_run_id) if job.mlflow.enabled else None
        if parent:
            plan.mlflow_parent_run_id = parent.run_id
            parent.log_params(_sweep_params(plan))
            say(f"MLflow parent run {parent.run_id} ({parent.experiment}): {parent.url or parent.tracking_uri}")
            jobs = {tid: _with_parent(spec, tid, parent) for tid, spec in jobs.items()}
        output_dir.mkdir(parents=True, exist_ok=True)
        plan.save(output_dir)

        done = {t.id for t in trials if read_outcome(t, output_dir / t.id, metric, settings.mode).finished}
        pending = [t for t in trials if t.id not in done] if resume else trials
        if done and resume:
            say(f"rayparallel: {len(done)} of {len(trials)} trials finished before; running the other {len(pending)}")
        say(
            f"rayparallel: sweeping {len(pending)} trials of {job.name}, {concurrent} at a time, "
            f"{settings.scheduler} scheduler, {metric} ({settings.mode}), in {output_dir}"
        )
        errors: dict[str, str] = {}
        if pending:
            try:
                errors = _tune(settings, metric, keys, pending, jobs, output_dir, concurrent, resume, say, worker_logs)
            except KeyboardInterrupt:
                if parent:
                    parent.end("KILLED")
                say(interrupted("tune", output_dir))
                raise
        outcomes = [read_outcome(t, output_dir / t.id, metric, settings.mode, errors.get(t.id)) for t in trials]
        return _conclude(job, outcomes, metric, settings.mode, output_dir, parent, say)


def trial_job(job: JobSpec, trial: Trial) -> JobSpec:
    """The job a trial runs: the sweep's job with the trial's overrides, checked."""
    try:
        return load_spec(replace(job, tune=TuneSpec()), trial.overrides)  # a trial is a plain run
    except SpecError as exc:
        raise SpecError(f"{trial.id} ({' '.join(trial.overrides)}): {exc}") from None


def _checked_metric(settings: TuneSpec, first_job: JobSpec) -> tuple[str, list[str]]:
    """The job's own checks on the first trial (builder, data, names) and the metric it reports."""
    keys = checked_job(first_job).epoch_keys
    metric = settings.metric or ("val_loss" if "val_loss" in keys else "loss")
    if metric not in keys:
        raise SpecError(
            f"--metric: expected one of the figures every epoch reports ({', '.join(keys)}), received {metric!r}"
        )
    return metric, keys


def _concurrency(jobs: dict[str, JobSpec], requested: int | None, checked: bool) -> int:
    """Trials at once: as many as the cluster holds of the largest trial, or the request if it fits."""
    from ..cluster.connect import check_capacity, runs_that_fit

    if not checked:  # a cluster that may autoscale (RAY_ADDRESS): Ray waits for room
        return min(requested or len(jobs), len(jobs))
    for tid, spec in jobs.items():
        try:
            check_capacity(spec)
        except RayParallelError as exc:
            raise RayParallelError(f"{tid}: {exc}") from None
    fits = {tid: runs_that_fit(spec) for tid, spec in jobs.items()}
    largest = min(fits, key=fits.get)
    if requested and requested > fits[largest]:
        raise RayParallelError(
            f"--max-concurrent: expected at most {fits[largest]} trials at once on this cluster ({largest} runs "
            f"{jobs[largest].scaling.described} workers), received {requested}"
        )
    return min(requested or fits[largest], len(jobs))


def _parent_run(job: JobSpec, run_id: str | None) -> SweepRun:
    from ..tracking.store import chosen_tracking_uri
    from ..tracking.sweep_run import SweepRun

    return SweepRun(
        chosen_tracking_uri(job.mlflow.tracking_uri),
        job.mlflow.experiment or job.name,
        f"{job.name}-sweep-{time.strftime('%Y%m%d-%H%M%S')}",
        run_id,
    )


def _with_parent(spec: JobSpec, trial_id: str, parent: SweepRun) -> JobSpec:
    """A trial's MLflow run: a child of the parent in its experiment; only the parent registers a model."""
    from ..tracking.sweep_run import PARENT_TAG

    tracking = replace(
        spec.mlflow,
        tracking_uri=parent.tracking_uri,
        experiment=parent.experiment,
        run_name=trial_id,
        register_model=None,
        tags={**spec.mlflow.tags, PARENT_TAG: parent.run_id, "rayparallel.trial": trial_id},
    )
    return replace(spec, mlflow=tracking)


def _sweep_params(plan: TrialPlan) -> dict[str, str]:
    settings = {k: v for k, v in plan.settings.items() if k != "params"}
    params = {f"tune.{key}": str(value) for key, value in settings.items()}
    params.update({f"tune.params.{key}": str(text) for key, text in plan.settings["params"].items()})
    params["tune.trials"] = str(len(plan.trials))
    return params


def _tune(
    settings: TuneSpec,
    metric: str,
    keys: list[str],
    pending: list[Trial],
    jobs: dict[str, JobSpec],
    output_dir: Path,
    concurrent: int,
    resume: bool,
    say,
    worker_logs: bool,
) -> dict[str, str]:
    """Ray Tune over the pending trials; returns the failed trials' errors (first line)."""
    import ray
    from ray import tune

    from ..errors import user_error
    from .console import SweepConsole
    from .trial import TrialSetup, asha_scheduler, trainable

    setup = TrialSetup(jobs, str(output_dir), os.getcwd(), None if resume else False, worker_logs, settings.scheduler)
    node = f"node:{ray.util.get_node_ip_address()}"  # trials run here: their files are on this machine
    scheduler = None
    if settings.scheduler == "asha":
        epochs = max(spec.train.epochs for spec in jobs.values())
        scheduler = asha_scheduler(
            str(output_dir),
            time_attr="epoch",  # not Tune's iteration count: a resumed trial reports from its next epoch
            max_t=epochs,
            grace_period=settings.grace_period,
            reduction_factor=settings.reduction_factor,
        )
    tuner = tune.Tuner(
        tune.with_resources(trainable(setup), {"CPU": 0, node: 0.001}),
        param_space={"trial": tune.grid_search([t.id for t in pending])},
        tune_config=tune.TuneConfig(
            metric=metric,
            mode=settings.mode,
            scheduler=scheduler,
            max_concurrent_trials=concurrent,
            reuse_actors=True,  # see RayParallelTrial.reset_config
        ),
        run_config=tune.RunConfig(
            name="ray_tune",
            storage_path=str(output_dir),
            verbose=0,
            callbacks=[SweepConsole({t.id: t for t in pending}, keys, say)],
        ),
    )
    tune_log = logging.getLogger("ray.tune")
    level = tune_log.level
    tune_log.setLevel(logging.CRITICAL)  # a failed trial's traceback: its one line is in our table
    try:
        with env_defaults("tune_driver"):
            grid = tuner.fit()
    finally:
        tune_log.setLevel(level)
    return {r.config["trial"]: first_line(user_error(r.error, "") or r.error) for r in grid if r.error is not None}


def _conclude(
    job: JobSpec,
    outcomes: list[TrialOutcome],
    metric: str,
    mode: str,
    output_dir: Path,
    parent: SweepRun | None,
    say,
) -> SweepResult:
    """The table on the console and in tune_results.csv, the parent run's record, the best weights."""
    best = best_outcome(outcomes, mode)
    table = write_csv(outcomes, output_dir / RESULTS_FILE, metric)
    say("\n" + format_table(outcomes, metric, best))
    say(f"  results: {table}")
    if best:
        say(f"  best: {best.trial.id}, {metric} {best.best:.6g}; weights: {best.final_weights}")
        say(f"  export: rayparallel export {best.final_weights} --batch-size 1 --out model.keras")
    else:
        say("  best: none (no trial finished)")
    if parent:
        if best:
            parent.log_best(best.trial.id, best.mlflow_run_id, best.history)
            build = lambda: _best_model(best, job.mlflow.model_batch_size)  # noqa: E731
            parent.log_model(build, job.mlflow.register_model, job.mlflow.register_alias)
        parent.end_orphans({o.mlflow_run_id for o in outcomes if o.mlflow_run_id})
        parent.log_artifact(str(table))
        parent.log_artifact(str(output_dir / PLAN_FILE))
        parent.end("FINISHED" if best else "FAILED")
        say(f"MLflow parent run {parent.run_id} finished: {parent.url or parent.tracking_uri}")
    return SweepResult(
        output_dir=str(output_dir),
        metric=metric,
        mode=mode,
        trials=[o.row(metric) for o in outcomes],
        best_trial=best.trial.id if best else None,
        best_value=best.best if best else None,
        best_weights=best.final_weights if best else None,
        results_csv=str(table),
        mlflow=parent.info() if parent else {},
    )


def _best_model(best: TrialOutcome, batch_size: int):
    """The best trial's best checkpoint by the monitor (its folder's manifest says which), as registered."""
    from ..checkpoint.export import load_model

    return load_model(Path(best.final_weights).parent, batch_size)
