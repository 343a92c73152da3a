"""Shared fixtures: one real local Ray for the whole session, shut down by the fixture itself."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def ray_address():
    """A local Ray started by this test session (4 logical CPUs so 3 workers fit on 2 cores)."""
    import ray

    os.chdir(REPO)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"TF_CPP_MIN_LOG_LEVEL": "2"}})
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def cli(*args: str, env: dict | None = None, timeout: float = 600):
    """Run `rayparallel ...` as a user would; returns the CompletedProcess."""
    import subprocess

    return subprocess.run([sys.executable, "-m", "rayparallel.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})
