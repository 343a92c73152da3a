"""`rayparallel submit`: the same job file on a remote cluster, through Ray's Jobs API.

It packs the working directory (honouring `.gitignore`), passes the tracking server's
address (`MLFLOW_TRACKING_URI`) and the spec's extra pip requirements in the job's
`runtime_env`, runs `rayparallel train JOB ...` as the job's entrypoint, follows its logs and
exits with the job's outcome. Token authentication is found as Ray's own CLI finds it.

Credentials are never sent with a job: its runtime_env and entrypoint are readable by anyone
who can list jobs on the dashboard. The cluster holds its own MLflow credentials (a
Kubernetes Secret in the RayCluster spec, the nodes' environment, or MLflow's credentials
file, see infra/README.md); a password set here is left out, and the console says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..errors import RayParallelError, first_line
from ..hooks import RAY_PACKAGING_LOGGERS
from ..secrets import without_credentials
from ..spec import load_spec

WITHHELD_ENV = (
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
)  # the cluster has its own
ALWAYS_EXCLUDED = ["runs/", "mlruns/", "mlflow.db", ".git/", "__pycache__/", "*.egg-info/"]
EXIT_CODES = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": 130}


def auth_token_source() -> str | None:
    """Where Ray's client will read the token from (Ray's order), or None."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return os.environ["RAY_AUTH_TOKEN_PATH"]
    default = Path.home() / ".ray" / "auth_token"
    return str(default) if default.is_file() else None


def runtime_env(job_file: Path, working_dir: Path, pip: Sequence[str]) -> dict:
    """The job's runtime_env: the working dir, the tracking address without credentials, pip extras."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    env: dict = {
        "working_dir": str(working_dir),
        "excludes": ALWAYS_EXCLUDED + _gitignore(working_dir),
        "env_vars": {"MLFLOW_TRACKING_URI": without_credentials(uri)} if uri else {},
    }
    if pip:
        env["pip"] = list(pip)
    return env


def submit(
    job: str,
    address: str,
    overrides: Sequence[str] = (),
    wait: bool = True,
    working_dir: str | None = None,
    output_dir: str | None = None,
    verbose: bool = False,
) -> int:
    """Submit `rayparallel train JOB` to the cluster at `address`; returns an exit code. Ray's lines about
    packing and uploading the working directory are shown with `verbose` only."""
    spec = load_spec(job, overrides)  # bad specs fail here, before anything is uploaded
    folder = Path(working_dir or os.getcwd()).resolve()
    job_path = Path(job).resolve()
    try:
        relative = job_path.relative_to(folder)
    except ValueError:
        raise RayParallelError(
            f"job file: expected a file inside the working dir {str(folder)!r}, received {job!r}"
        ) from None
    client = _client(address)
    withheld = withheld_credentials(overrides)
    if withheld:
        print(
            f"rayparallel: not sent with the job: {', '.join(withheld)} (a job's environment and command are "
            "readable by anyone who can list jobs); the cluster uses its own MLflow credentials (infra/README.md)"
        )
    safe = [without_credentials(o) for o in overrides]
    arguments = ["rayparallel", "train", str(relative)] + [a for o in safe for a in ("--set", o)]
    if output_dir:
        arguments += ["--output-dir", output_dir]
    entrypoint = shlex.join(arguments)
    with packaging_lines_shown(verbose):
        job_id = client.submit_job(
            entrypoint=entrypoint,
            runtime_env=runtime_env(job_path, folder, spec.run.pip),
            metadata={"rayparallel.job": spec.name},
        )
    print(f"rayparallel: submitted {spec.name} as Ray job {job_id} to {address}")
    print(
        f"  follow: ray job logs --address {address} --follow {job_id}; stop: ray job stop --address {address} {job_id}"
    )
    if not wait:
        return 0
    return _follow(client, job_id)


@contextlib.contextmanager
def packaging_lines_shown(show: bool) -> Iterator[None]:
    """Ray's packaging narration ("Ignoring upload...", "... is now ignored ...", "Pushing file package")
    held back in the block, unless `show`: the working directory still goes, excluded files as before."""
    loggers = [logging.getLogger(name) for name in RAY_PACKAGING_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers if not show else []:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def withheld_credentials(overrides: Sequence[str] = ()) -> list[str]:
    """The credentials set here that the job will not carry: secret variables, passwords in URLs."""
    names = [name for name in WITHHELD_ENV if os.environ.get(name)]
    if without_credentials(os.environ.get("MLFLOW_TRACKING_URI", "")) != os.environ.get("MLFLOW_TRACKING_URI", ""):
        names.append("the user and password in MLFLOW_TRACKING_URI")
    names += [f"the user and password in --set {o.partition('=')[0]}" for o in overrides if without_credentials(o) != o]
    return names


def _client(address: str):
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    source = auth_token_source()
    if source and not os.environ.get("RAY_AUTH_MODE"):
        os.environ["RAY_AUTH_MODE"] = "token"  # as `ray job submit` does when a token is configured
    try:
        return JobSubmissionClient(address)
    except AuthenticationError:
        received = f"the token from {source}, which the cluster rejected" if source else "no token"
        raise RayParallelError(
            f"--address {address}: expected a valid Ray auth token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or "
            f"~/.ray/auth_token; `ray get-auth-token` on the head prints it), received {received}"
        ) from None
    except (ConnectionError, RuntimeError, ValueError) as exc:
        first = first_line(exc)
        raise RayParallelError(
            f"--address: expected a Ray dashboard (http://HEAD:8265), received no answer at {address!r} ({first[:200]})"
        ) from None


def _follow(client, job_id: str) -> int:
    from ray.job_submission import JobStatus

    shown = 0
    while True:
        status = client.get_job_status(job_id)
        logs = client.get_job_logs(job_id)
        sys.stdout.write(logs[shown:])
        sys.stdout.flush()
        shown = len(logs)
        if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            print(f"rayparallel: Ray job {job_id} {status.value}")
            return EXIT_CODES[status.value]
        time.sleep(1.0)


def _gitignore(folder: Path) -> list[str]:
    path = folder / ".gitignore"
    if not path.is_file():
        return []
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
