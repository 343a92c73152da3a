"""A real two-node Ray cluster on 127.0.0.1: `ray job submit`, `rayparallel submit`, placement,
elastic runs that lose and regain a node.

The fixture starts a head (dashboard, 2 CPUs, 2 fake GPUs) and a second node (1 CPU) with
`ray start --block` on their own ports, and stops only the processes it started. Each node
has one `slot` resource, so a job asking for a slot per worker gets one worker per node.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.models import lstm_job

from .helpers import REPO, cli, final_weights, free_port, keras_fit_streams, max_relative_error

pytestmark = pytest.mark.slow

AUTH = {"RAY_AUTH_MODE": "token"}
# A lost node is declared dead after about 3 s here (Ray's defaults: 3 s x 5 missed checks)
FAST_NODE_DEATH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}
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
    env = {**os.environ, **AUTH, **FAST_NODE_DEATH}
    return subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True, env=env)


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
        "--resources",
        '{"slot": 1}',
        "--ray-client-server-port",
        str(free_port()),
        log=log,
        worker_ports=61000,
    )
    nodes = Nodes(head, gcs, log)
    try:
        address = f"http://127.0.0.1:{dashboard}"
        _wait_for_dashboard(address)
        nodes.add()
        _wait_for_nodes(address, 2)
        nodes.address = address
        yield nodes
    finally:
        nodes.stop_all()
        log.close()
        marker = "/tmp/ray/ray_current_cluster"  # `ray start --head` leaves it pointing at our dead head
        if os.path.exists(marker) and open(marker).read().strip().endswith(f":{gcs}"):
            os.remove(marker)


class Nodes:
    """The fixture's cluster: `address` (the dashboard) and the second nodes, which a test may end and add."""

    def __init__(self, head: subprocess.Popen, gcs: int, log):
        self.address, self._gcs, self._log = "", gcs, log
        self.started = [head]

    def add(self) -> subprocess.Popen:
        node = ray_start(
            "--address",
            f"127.0.0.1:{self._gcs}",
            "--num-cpus",
            "1",
            "--num-gpus",
            "0",
            "--resources",
            '{"slot": 1}',
            log=self._log,
            worker_ports=61400 + 300 * (len(self.started) - 1),
        )
        self.started.append(node)
        return node

    @staticmethod
    def end(node: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
        if node.poll() is None:
            os.killpg(node.pid, sig)
            try:
                node.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait(timeout=10)

    @staticmethod
    def lose(node: subprocess.Popen) -> None:
        """A node lost at once, as a failed host: SIGKILL to its raylet, its workers and everything else it started."""
        children: dict[int, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])  # fields after the name: state, ppid
                children.setdefault(parent, []).append(int(stat.parent.name))
            except (OSError, IndexError):
                continue
        doomed, queue = [], [node.pid]
        while queue:
            pid = queue.pop()
            doomed.append(pid)
            queue.extend(children.get(pid, []))
        for pid in doomed:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        node.wait(timeout=10)

    def stop_all(self) -> None:
        for node in reversed(self.started):  # only the processes this fixture started
            self.end(node)


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


def test_ray_job_submit_spreads_ray_data_workers_over_both_nodes_and_matches_one_node(
    cluster, default_job_runs, tmp_path
):
    """The default job's Ray Data variant (its streams as parquet) on 2 nodes, one worker each, a CPU left
    for Ray Data's read tasks: the weights of the in-memory job on one node."""
    data = tmp_path / "co2-streams"
    written = subprocess.run(
        [sys.executable, "-m", "jobs.stateful_lstm", "--write-data", str(data)], cwd=REPO, capture_output=True
    )
    assert written.returncode == 0, written.stderr[-2000:]
    out = tmp_path / "out"
    sets = ["train.epochs=3", "scaling.placement_strategy=STRICT_SPREAD", "mlflow.enabled=false"]
    sets.append(f"data.kwargs.path={data}")
    command = [sys.executable, "-m", "ray.scripts.scripts", "job", "submit", "--address", cluster.address]
    command += ["--working-dir", str(REPO), "--", "rayparallel", "train", "jobs/stateful_lstm_parquet.yaml"]
    command += [arg for item in sets for arg in ("--set", item)] + ["--output-dir", str(out)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=900, env={**os.environ, **AUTH})
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "succeeded" in (run.stdout + run.stderr).lower()
    result = json.loads((out / "result.json").read_text())
    assert len({w["node_id"] for w in result["workers"]}) == 2  # one worker on each node
    two_nodes = default_job_runs.weights(result["final_weights"])
    one_node = default_job_runs.weights(default_job_runs.results[2]["final_weights"])
    error = max_relative_error(two_nodes, one_node)
    print(f"ray job submit, Ray Data on 2 nodes vs in-memory arrays on 1 node: max relative weight error {error:.2e}")
    assert error < 1e-5


def test_rayparallel_submit_with_one_fake_gpu_per_worker(cluster, tmp_path):
    out = tmp_path / "gpu"
    run = cli(
        "submit",
        "jobs/stateful_lstm.yaml",
        "--address",
        cluster.address,
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
    for packaging in ("Ignoring upload", "is now ignored", "Pushing file package", "Uploading package"):
        assert packaging not in run.stdout + run.stderr, packaging  # Ray's narration: with --verbose only
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
        "submit",
        "jobs/stateful_lstm.yaml",
        "--address",
        cluster.address,
        env={"HOME": str(home), "RAY_AUTH_MODE": "token"},
    )
    assert no_token.returncode == 2, no_token.stdout[-2000:]
    assert "expected a valid Ray auth token" in no_token.stderr and "received no token" in no_token.stderr


def test_a_ray_data_job_whose_workers_take_every_cpu_is_refused_before_training(cluster, tmp_path):
    """The cluster has no autoscaler (nodes started by hand): 3 workers x 1 CPU on its 3 CPUs would leave
    Ray Data's read tasks none, and the run would wait forever. It is one line, exit 2, before any worker."""
    spec = lstm_job("starved", "mlflow.enabled=false")
    spec["data"] = {"dataset": "tests.models:parquet_dataset", "kwargs": {"path": str(tmp_path)}, "layout": "streams"}
    spec["scaling"] = {"num_workers": 3}
    job = tmp_path / "starved.yaml"
    job.write_text(yaml.safe_dump(spec))
    command = [sys.executable, "-m", "ray.scripts.scripts", "job", "submit", "--address", cluster.address]
    command += ["--working-dir", str(REPO), "--", "rayparallel", "train", str(job), "--output-dir", str(tmp_path / "o")]
    run = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **AUTH}, timeout=300)
    output = run.stdout + run.stderr
    assert run.returncode != 0, output[-3000:]
    errors = {line for line in output.splitlines() if line.startswith("rayparallel: error:")}  # logs shown twice
    assert errors == {
        "rayparallel: error: scaling: expected at least 1 CPU beyond the workers' 3 for Ray Data's read tasks "
        "(data.dataset), received a cluster with 3 CPU that cannot grow; use fewer workers or a lower "
        "scaling.resources_per_worker.CPU (now 1)"
    }, output[-3000:]
    assert "Epoch 1/" not in output and not (tmp_path / "o" / "run.json").exists()


def test_ray_job_submit_serves_streams_from_a_replica_on_each_node(cluster, default_job_runs):
    """`rayparallel serve` as a Ray job on the 2 nodes (the HTTP proxy on the head: both nodes share this
    machine's ports), 2 replicas: Ray Serve puts one on each node, streams are answered by both, each as the
    batch-1 loop answers it; `ray job stop` ends it like Ctrl-C, the application deleted."""
    import uuid

    from .test_serve import batch_1_loop, client, infer

    port, job_id = free_port(), f"serve-{uuid.uuid4().hex[:8]}"
    ray_job = [sys.executable, "-m", "ray.scripts.scripts", "job"]
    command = [*ray_job, "submit", "--address", cluster.address, "--no-wait", "--submission-id", job_id]
    command += ["--working-dir", str(default_job_runs.cwd), "--", "rayparallel", "serve", "jobs/stateful_lstm.yaml"]
    command += ["--weights", "runs/stateful-lstm-co2/checkpoints", "--replicas", "2", "--slots", "4"]
    command += ["--port", str(port), "--proxy-location", "HeadOnly"]
    env = {**os.environ, **AUTH}
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    url = f"127.0.0.1:{port}"
    try:
        triton_client = _serving(client, url, ray_job, cluster.address, job_id, env)
        rng = np.random.default_rng(8)
        streams = {i: list(rng.normal(size=(3, 8, 2)).astype("float32")) for i in range(1, 9)}
        answers, replicas = {i: [] for i in streams}, {}
        for i, windows in streams.items():
            for t, window in enumerate(windows):
                change, replicas[i] = infer(triton_client, window, i, start=t == 0, end=t == 2)
                answers[i].append(change)
        weights = str(default_job_runs.cwd / "runs/stateful-lstm-co2/checkpoints")
        for i, windows in streams.items():
            assert np.abs(np.array(answers[i]) - batch_1_loop(weights, windows)).max() < 1e-5, i
        nodes = _replica_nodes(cluster.address, env)
        assert len(set(replicas.values())) == 2 and {nodes[r] for r in replicas.values()} == set(nodes.values())
        assert len(set(nodes.values())) == 2, nodes  # the two replicas that answered, on two nodes
    finally:
        subprocess.run([*ray_job, "stop", "--address", cluster.address, job_id], capture_output=True, env=env)


def _serving(client, url: str, ray_job: list, address: str, job_id: str, env: dict, timeout: float = 300):
    """Triton's client once the command says it is up (every replica answers through the front by then);
    the job's logs if it ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logs = subprocess.run([*ray_job, "logs", "--address", address, job_id], capture_output=True, text=True, env=env)
        if "rayparallel serve: up until Ctrl-C" in logs.stdout:
            triton_client = client(url)
            assert triton_client.is_model_ready("stateful-lstm-co2")
            return triton_client
        status = subprocess.run(
            [*ray_job, "status", "--address", address, job_id], capture_output=True, text=True, env=env
        )
        if any(word in status.stdout for word in ("FAILED", "STOPPED", "SUCCEEDED")):
            raise AssertionError(f"the serve job ended: {status.stdout[-500:]}\n{logs.stdout[-3000:]}")
        time.sleep(2)
    raise AssertionError(f"the serve job not up within {timeout:g} s")


def _replica_nodes(address: str, env: dict) -> dict[str, str]:
    """Each live stream replica's id (as answers name it) -> its node, from Ray's state API."""
    command = [sys.executable, "-m", "ray.scripts.scripts", "list", "actors", "--address", address, "--detail"]
    command += ["--filter", "state=ALIVE", "--format", "json", "--limit", "1000"]
    run = subprocess.run(command, capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    actors = json.loads(run.stdout)
    names = {a["name"]: a["node_id"] for a in actors if (a.get("name") or "").startswith("SERVE_REPLICA::")}
    return {name.rsplit("#", 1)[1]: node for name, node in names.items() if "-streams#" in name}


def elastic_job(tmp_path, name: str, workers: int | dict, tracking_uri: str) -> Path:
    """The stateful LSTM with one worker per node (a `slot` each), resume points every 20 steps.

    Up to 140 short epochs, long enough on 1 worker for a node that joins after the shrink to be
    seen (Ray Train sees a joined node within about 25 s: its resource coordinator looks every
    20 s, the elastic monitor here every 2 s); a callback ends the run 3 epochs into the group
    that grew back. Many short epochs fill that time with few steps: float32 sums in another
    order drift apart with every step (30 epochs of 598 steps ended 1.9e-5 apart, past the 1e-5
    the test asks).
    """
    spec = lstm_job(
        name,
        "data.kwargs.windows=40",  # 38 steps an epoch
        "train.epochs=140",
        "train.optimizer.config.learning_rate=0.005",
        "run.resume_every_n_steps=20",
        "failure.max_failures=3",
    )
    spec["train"]["callbacks"] = [
        {"class": "tests.callbacks:StopAfterRegrowing", "kwargs": {"workers": 2, "epochs": 3}}
    ]
    spec["scaling"] = {
        "num_workers": workers,
        "resources_per_worker": {"CPU": 1, "slot": 1},
        "elastic_resize_monitor_interval_s": 2,
    }
    spec["mlflow"] = {
        "tracking_uri": tracking_uri,
        "experiment": name,
        "system_metrics_interval_s": 2,
    }
    job = tmp_path / f"{name}.yaml"
    job.write_text(yaml.safe_dump(spec))
    return job


def submit_and_watch(cluster: Nodes, job: Path, out: Path, *actions) -> tuple[dict, str, list[float]]:
    """`ray job submit` the job; act as it goes: `actions` are `(when, then)` pairs, taken in order, where
    `when` is a glob of the Ray run folder (a resume point) or text of the console, and `then()` is called
    once it is there.

    Returns result.json, the console output, and when each `then` was called. The driver runs on
    the head (as submitted jobs do), so the test process's own Ray is not involved: two Ray
    instances on one machine confuse Ray Train's clean-up actor.
    """
    command = [sys.executable, "-m", "ray.scripts.scripts", "job", "submit", "--address", cluster.address]
    command += ["--working-dir", str(REPO), "--", "rayparallel", "train", str(job), "--output-dir", str(out)]
    log = open(out.parent / f"{out.name}.log", "w+")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, env={**os.environ, **AUTH})
    deadline, acted_at, pending = time.monotonic() + 600, [], list(actions)
    while pending and process.poll() is None and time.monotonic() < deadline:
        when, then = pending[0]
        if _seen(when, out, log):
            acted_at.append(time.time())
            then()
            pending.pop(0)
        time.sleep(0.05)
    process.wait(timeout=max(1, deadline - time.monotonic()))
    log.seek(0)
    output = log.read()
    assert process.returncode == 0, output[-3000:]
    return json.loads((out / "result.json").read_text()), output, acted_at


def _seen(when: str, out: Path, log) -> bool:
    if not when.startswith("epoch-"):  # console text, as the submit process wrote it so far
        return when in Path(log.name).read_text()
    if not (out / "run.json").exists():
        return False
    run = json.loads((out / "run.json").read_text())
    return any((Path(run["storage_path"]) / run["ray_run_name"]).glob(when))


def test_elastic_run_shrinks_when_a_node_is_lost_and_grows_when_one_joins(cluster, mlflow_server, tmp_path):
    """One elastic run: the second node is lost inside epoch 2 (2 -> 1 workers), then a node joins
    (1 -> 2), 3 epochs later the run stops; it ends with the weights of plain Keras `fit` in this
    process for as many epochs (the same streams, seed and settings on one device), and its run in
    a real `mlflow server` has the System Metrics of both nodes of the last group."""
    from mlflow.tracking import MlflowClient

    from tests.models import stateful_lstm

    second = cluster.started[1]
    job = elastic_job(tmp_path, "elastic", {"min": 1, "max": 2}, mlflow_server.uri)
    lose = ("epoch-0001-step-*", lambda: cluster.lose(second))
    rejoin = ("resized 2 -> 1 workers", cluster.add)  # once the run goes on without it
    result, output, (lost_at, joined_at) = submit_and_watch(cluster, job, tmp_path / "elastic", lose, rejoin)
    shrink, grow = result["resizes"]
    assert (shrink["from"], shrink["to"], shrink["epoch"]) == (2, 1, 2), result["resizes"]
    assert f"resized 2 -> 1 workers at epoch 2 step {shrink['step']} (per-worker batch 3 -> 6)" in output
    assert 0 < shrink["step"] < 38  # inside the epoch: from a resume point, not the epoch's start
    assert (grow["from"], grow["to"]) == (1, 2) and grow["epoch"] > shrink["epoch"], result["resizes"]
    assert len(result["workers"]) == 2 and len({w["node_id"] for w in result["workers"]}) == 2
    epochs = len(result["history"])
    assert epochs == grow["epoch"] + 2 and result["stopped"], (epochs, grow, result["stopped"])  # G, G+1, G+2
    spec = yaml.safe_load(job.read_text())
    spec["train"]["epochs"] = epochs
    reference = keras_fit_streams(spec)[0].get_weights()
    error = max_relative_error(final_weights(result["final_weights"], stateful_lstm), reference)
    client = MlflowClient(mlflow_server.uri)
    runs = client.search_runs([client.get_experiment_by_name("elastic").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "val_loss")] == list(range(1, epochs + 1))
    assert [m.value for m in client.get_metric_history(runs[0].info.run_id, "num_workers")] == [2, 1, 2]
    sampled = {key.split("/")[1] for key in runs[0].data.metrics if key.endswith("/cpu_utilization_percentage")}
    assert sampled >= {w["node_id"][:8] for w in result["workers"]}  # the System Metrics of every node that trained
    print(
        f"elastic: lost a node at epoch 2 -> 1 worker, {shrink['first_step_at'] - lost_at:.1f} s from the node "
        f"loss to the first step of the new group; a node joined -> 2 workers at epoch {grow['epoch']}, "
        f"{grow['first_step_at'] - joined_at:.1f} s from `ray start` to the first step of the new group; "
        f"max relative weight error vs Keras fit {error:.2e}"
    )
    assert error < 1e-5
