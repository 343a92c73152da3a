"""One Tune trial: a whole rayparallel run of the job with the trial's overrides.

This is Ray's documented shape for Train V2 under Tune, a function trainable that runs the
trainer, here through rayparallel's own driver so the trial gets everything a run has: its
recorder, checkpoint files, resume state, result.json and its MLflow run. Each epoch's
global logs go to Tune, so a scheduler such as ASHA can stop a bad trial; a stopped trial
ends as a finished run (its files and MLflow run complete), not as a killed process.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..hooks import hook

if TYPE_CHECKING:
    from ray.tune.schedulers import TrialScheduler

    from ..spec import JobSpec

# How long a trial that Tune stops may take to end its run (the epoch in progress, the final
# weights, MLflow) before Tune may remove the process.
STOP_GRACE_S = 300.0


@dataclass(frozen=True)
class TrialSetup:
    """What every trial needs, shipped once with the trainable."""

    jobs: dict[str, JobSpec]  # trial id -> its job: the sweep's job with the trial's overrides
    output_dir: str  # the sweep's folder; a trial writes to <output_dir>/<trial id>
    workdir: str  # where the user's modules and relative paths are, as for `rayparallel train`
    resume: bool | None  # None: continue a trial's unfinished run; False: start it fresh
    worker_logs: bool
    scheduler: str


def run_trial(config: dict, setup: TrialSetup) -> None:
    from ray import tune

    from ..cluster.run import run_job

    os.chdir(setup.workdir)  # Tune starts a trial in its own folder
    told: list[int] = []

    def report(epoch: int, logs: dict) -> str | None:
        if told:  # Tune has stopped this trial: the run is ending
            return None
        try:
            tune.report(dict(logs, epoch=epoch))
        except SystemExit:  # how Tune's function API tells a trial to stop, at its next report
            told.append(epoch)
            return f"stopped by Ray Tune's {setup.scheduler} scheduler at epoch {epoch}"
        return None

    trial = config["trial"]
    out = Path(setup.output_dir) / trial
    run_job(
        setup.jobs[trial],
        output_dir=out,
        verbose=False,
        worker_logs=setup.worker_logs,
        resume=setup.resume,
        started_at=time.time(),
        on_epoch=report,
    )


def trainable(setup: TrialSetup) -> type:
    """The Tune trainable: a function trainable whose stop waits for the run to end."""
    base = hook("wrap_function")(functools.partial(run_trial, setup=setup), name="rayparallel_trial")

    class RayParallelTrial(base):
        def cleanup(self) -> None:
            # Tune's own cleanup does not wait for the function's thread, and the actor goes
            # once it returns; the run needs its last epoch and its files written first.
            hook("train_session")().finish(timeout=STOP_GRACE_S)
            super().cleanup()

        def reset_config(self, new_config: dict) -> bool:
            # the sweep reuses a trial's process for the next trial (TensorFlow and Ray Train
            # already imported: seconds of each trial's start-up); Tune's own reset waits 2 s
            # for the function's thread and else starts a new process, which would leave this run
            # to the cleanup above
            hook("train_session")().finish(timeout=STOP_GRACE_S)
            return super().reset_config(new_config)

    return RayParallelTrial


def asha_scheduler(output_dir: str, **asha: Any) -> TrialScheduler:
    """Tune's ASHA, whose stop asks the trial's own run to end after the epoch in progress.

    Tune's stop marks a trial terminated at once; when no trial is left running, Tune ends the
    experiment and kills the trials still stopping after 10 s (a fixed force-cleanup time), which
    on a loaded node cut runs off before their final weights, result.json and MLflow run were
    written. Asked through its recorder instead, the run ends as a finished run and the trial's
    function returns, as a trial that ran all its epochs does.
    """
    from ray.tune.schedulers import ASHAScheduler, TrialScheduler

    asked: set[str] = set()  # trials whose run was asked to end: it ends by itself, never by Tune

    class RunEndingASHA(ASHAScheduler):
        def on_trial_result(self, tune_controller, trial, result):  # Tune's signature
            decision = super().on_trial_result(tune_controller, trial, result)
            name, reason = trial.config["trial"], f"stopped by Ray Tune's asha scheduler at epoch {result['epoch']}"
            if name not in asked and decision == TrialScheduler.STOP and request_stop(Path(output_dir) / name, reason):
                asked.add(name)
            return TrialScheduler.CONTINUE if name in asked else decision

    return RunEndingASHA(**asha)


def request_stop(trial_folder: Path, reason: str) -> bool:
    """Ask the trial's live run (its recorder, named after the Ray run in run.json) to end."""
    import ray

    from ..cluster.run_state import read_run_state
    from ..recorder.actor import recorder_name

    state = read_run_state(trial_folder)
    if state is None:
        return False
    try:
        recorder = ray.get_actor(recorder_name(state.ray_run_name))
    except ValueError:  # the run has just ended
        return False
    recorder.request_stop.remote(reason)
    return True
