"""A real two-node Ray cluster on 127.0.0.1: `ray job submit`, `rayparallel submit`, placement.

The fixture starts a head (dashboard, 2 CPUs, 2 fake GPUs) and a second node (1 CPU) with
`ray start --block` on their own ports, and stops only those two processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from .helpers import REPO, cli, free_port, max_relative_error

pytestmark = pytest.mark.slow

AUTH = {"RAY_AUTH_MODE": "token"}
PORT_FLAGS = (
    "node-manager-port",
    "object-manager-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "runtime-env-agent-port",
    "metrics-export-port",
)


def ray_start(*args: str, log, worker_ports: int) -> subprocess.Popen:
    """`ray start --block` on free ports; worker ports above Linux's ephemeral range (no clashes)."""
    ports = [free_port() for _ in PORT_FLAGS]
    low = worker_ports
    command = [
        sys.executable,
        "-m",
        "ray.scripts.scripts",
        "start",
        "--block",
        "--disable-usage-stats",
        "--node-ip-address",
        "127.0.0.1",
        *[arg for flag, port in zip(PORT_FLAGS, ports, strict=True) for arg in (f"--{flag}", str(port))],
        "--min-worker-port",
        str(low),
        "--max-worker-port",
        str(low + 200),
        *args,
    ]
    return subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True, env={**os.environ, **AUTH})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cluster")
    log = open(folder / "ray.log", "w")
    gcs, dashboard = free_port(), free_port()
    head = ray_start(
        "--head",
        "--port",
        str(gcs),
        "--dashboard-host",
        "127.0.0.1",
        "--dashboard-port",
        str(dashboard),
        "--num-cpus",
        "2",
        "--num-gpus",
        "2",
        "--ray-client-server-port",
        str(free_port()),
        log=log,
        worker_ports=61000,
    )
    nodes = [head]
    try:
        address = f"http://127.0.0.1:{dashboard}"
        _wait_for_dashboard(address)
        nodes.append(
            ray_start(
                "--address", f"127.0.0.1:{gcs}", "--num-cpus", "1", "--num-gpus", "0", log=log, worker_ports=61400
            )
        )
        _wait_for_nodes(address, 2)
        yield address
    finally:
        for node in reversed(nodes):  # only the processes this fixture started
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGTERM)
                try:
                    node.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(node.pid, signal.SIGKILL)
        log.close()
        marker = "/tmp/ray/ray_current_cluster"  # `ray start --head` leaves it pointing at our dead head
        if os.path.exists(marker) and open(marker).read().strip().endswith(f":{gcs}"):
            os.remove(marker)


def _wait_for_dashboard(address: str, timeout: float = 120) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{address}/api/version", timeout=2)
            return
        except OSError as exc:
            if getattr(exc, "code", None):  # an HTTP answer (401 without a token) means it is up
                return
            time.sleep(1)
    raise RuntimeError(f"no Ray dashboard at {address}")


def _wait_for_nodes(address: str, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "ray.scripts.scripts",
                "list",
                "nodes",
                "--address",
                address,
                "--filter",
                "state=ALIVE",
                "--format",
                "json",
            ],
            capture_output=True,
            text=True,
            env={**os.environ, **AUTH},
        )
        if run.returncode == 0 and run.stdout.lstrip().startswith("[") and len(json.loads(run.stdout)) >= count:
            return
        time.sleep(1)
    raise RuntimeError(f"{count} nodes not alive at {address}")


def test_ray_job_submit_spreads_workers_over_both_nodes_and_matches_one_node(cluster, default_job_runs, tmp_path):
    out = tmp_path / "out"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "ray.scripts.scripts",
            "job",
            "submit",
            "--address",
            cluster,
            "--working-dir",
            str(REPO),
            "--",
            "rayparallel",
            "train",
            "jobs/stateful_lstm.yaml",
            "--set",
            "train.epochs=3",
            "--set",
            "scaling.placement_strategy=STRICT_SPREAD",
            "--set",
            "mlflow.enabled=false",
            "--output-dir",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **AUTH},
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "succeeded" in (run.stdout + run.stderr).lower()
    result = json.loads((out / "result.json").read_text())
    assert len({w["node_id"] for w in result["workers"]}) == 2  # one worker on each node
    two_nodes = default_job_runs.weights(result["final_weights"])
    one_node = default_job_runs.weights(default_job_runs.results[2]["final_weights"])
    error = max_relative_error(two_nodes, one_node)
    print(f"ray job submit on 2 nodes vs 1 node: max relative weight error {error:.2e}")
    assert error < 1e-5


def test_rayparallel_submit_with_one_fake_gpu_per_worker(cluster, tmp_path):
    out = tmp_path / "gpu"
    run = cli(
        "submit",
        "jobs/stateful_lstm.yaml",
        "--address",
        cluster,
        "--set",
        "train.epochs=1",
        "--set",
        "scaling.use_gpu=true",
        "--set",
        "mlflow.enabled=false",
        "--output-dir",
        str(out),
        env=AUTH,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "SUCCEEDED" in run.stdout and "Epoch 1/1" in run.stdout and "placement: rank 0" in run.stdout
    workers = json.loads((out / "result.json").read_text())["workers"]
    assert sorted(g for w in workers for g in w["gpu_ids"]) == ["0", "1"]  # exactly one GPU each, distinct
    assert all(len(w["gpu_ids"]) == 1 for w in workers)


def test_submit_errors_are_one_line(cluster, tmp_path):
    no_cluster = cli("submit", "jobs/stateful_lstm.yaml", "--address", f"http://127.0.0.1:{free_port()}")
    assert no_cluster.returncode == 2
    assert no_cluster.stderr.strip().startswith(
        "rayparallel: error: --address: expected a Ray dashboard (http://HEAD:8265), received no answer"
    )
    home = tmp_path / "home"
    home.mkdir()
    no_token = cli(
        "submit", "jobs/stateful_lstm.yaml", "--address", cluster, env={"HOME": str(home), "RAY_AUTH_MODE": "token"}
    )
    assert no_token.returncode == 2, no_token.stdout[-2000:]
    assert "expected a valid Ray auth token" in no_token.stderr and "received no token" in no_token.stderr
