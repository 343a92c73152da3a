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
    ray.init(
        address="local",
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"TF_CPP_MIN_LOG_LEVEL": "2"}},
    )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def cli(*args: str, env: dict | None = None, cwd: Path = REPO, timeout: float = 600):
    """Run `rayparallel ...` as a user would; returns the CompletedProcess."""
    import subprocess

    environment = {**os.environ, **(env or {})}
    environment = {k: v for k, v in environment.items() if v != ""}  # "" unsets
    return subprocess.run(
        [sys.executable, "-m", "rayparallel.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
    )


class DefaultJobRuns:
    """The default job run through the CLI on 1 and 2 workers (3 epochs), shared by tests."""

    def __init__(self, root: Path, address: str):
        import json

        self.results, self.stdout = {}, {}
        for workers in (1, 2):
            out = root / f"w{workers}"
            run = cli(
                "train",
                "jobs/stateful_lstm.yaml",
                "--set",
                f"scaling.num_workers={workers}",
                "--set",
                "train.epochs=3",
                "--set",
                "mlflow.enabled=false",
                "--output-dir",
                str(out),
                env={"RAY_ADDRESS": address},
            )
            assert run.returncode == 0, run.stderr[-3000:]
            self.stdout[workers] = run.stdout
            self.results[workers] = json.loads((out / "result.json").read_text())

    @staticmethod
    def weights(path: str) -> list:
        from jobs.stateful_lstm import build_model

        model = build_model(batch_size=1)
        model.load_weights(path)
        return model.get_weights()


@pytest.fixture(scope="session")
def default_job_runs(ray_address, tmp_path_factory):
    return DefaultJobRuns(tmp_path_factory.mktemp("default-job"), ray_address)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """A real `mlflow server` on 127.0.0.1 with a sqlite store and a temporary artifact folder."""

    def __init__(self, folder: Path):
        import subprocess

        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log = open(folder / "mlflow-server.log", "w")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--backend-store-uri",
                f"sqlite:///{folder}/mlflow.db",
                "--artifacts-destination",
                str(folder / "artifacts"),
                "--workers",
                "1",
            ],
            stdout=self.log,
            stderr=self.log,
            start_new_session=True,
        )
        self._wait_healthy()

    def _wait_healthy(self, timeout: float = 90) -> None:
        import time
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.process.returncode}; see {self.log.name}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"mlflow server not healthy after {timeout}s; see {self.log.name}")

    def stop(self) -> None:
        """Stop only this server (its own process group)."""
        import signal

        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except Exception:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow"))
    try:
        yield server
    finally:
        server.stop()
