"""`rayparallel serve` on a real Ray Serve over loopback HTTP, through Triton's own Python client: live streams
answered as the batch-1 loop answers them, each stream kept on one replica, the idle timeout, a corpus of bad
requests answered in one line while the server goes on serving, and (last: the server is one replica short for a
while after it) a replica killed mid-stream."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from .helpers import cli, free_port, wait_for

pytestmark = pytest.mark.slow

NAME = "stateful-lstm-co2"
IDLE_S = 10.0  # longer than any stream's gap between windows here, even on a busy machine


@pytest.fixture(scope="module")
def server(default_job_runs, ray_address):
    """The default job's registered model (`models:/...@champion`, from the training run's MLflow registry)
    served by the command as a user types it (`--detach`: the test session's Ray keeps it), 2 replicas of 8
    slots; deleted with Ray Serve at the end. The answers' oracle loads the run's best checkpoint from its
    folder, which the registry's version must be."""
    from ray import serve

    port = free_port()
    runs = default_job_runs
    args = ["--model", f"models:/{NAME}@champion", "--replicas", "2", "--slots", "8"]
    args += ["--idle-timeout-s", str(IDLE_S), "--port", str(port), "--detach"]
    run = cli("serve", "jobs/stateful_lstm.yaml", *args, env=runs.env, cwd=runs.cwd)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert f"http://127.0.0.1:{port}/v2/models/{NAME}" in run.stdout and "8 slots x 2 replicas" in run.stdout
    run_id = runs.results[2]["mlflow"]["run_id"]
    assert f"model models:/{NAME}@champion (version 1 of {NAME}, run {run_id})" in run.stdout
    try:
        yield f"127.0.0.1:{port}", str(runs.cwd / "runs/stateful-lstm-co2/checkpoints")
    finally:
        serve.shutdown()


def client(url: str):
    import tritonclient.http as triton

    return triton.InferenceServerClient(url)


def infer(triton_client, window: np.ndarray, stream, start=False, end=False):
    import tritonclient.http as triton

    tensor = triton.InferInput("co2_features", [1, *window.shape], "FP32")
    tensor.set_data_from_numpy(window[None].astype("float32"))  # binary, as tritonclient sends by default
    result = triton_client.infer(NAME, [tensor], sequence_id=stream, sequence_start=start, sequence_end=end)
    return result.as_numpy("change")[0], result.get_response()["parameters"]["rayparallel_replica"]


def batch_1_loop(weights: str, windows: list[np.ndarray]) -> np.ndarray:
    import rayparallel

    model = rayparallel.load_model(weights, batch_size=1)
    return np.array([model.predict_on_batch(w[None])[0] for w in windows])


def test_live_streams_equal_the_batch_1_loop_and_stay_on_their_replica(server):
    """8 streams, each round's windows in a random order with random idle gaps; stream 3 ends and starts again
    half-way."""
    url, weights = server
    triton_client = client(url)
    assert triton_client.is_server_live() and triton_client.is_model_ready(NAME)
    metadata = triton_client.get_model_metadata(NAME)
    assert metadata["inputs"] == [{"name": "co2_features", "datatype": "FP32", "shape": [-1, 8, 2]}]
    assert metadata["versions"] == ["1"]  # the registered version served
    rng = np.random.default_rng(11)
    streams = {i: list(rng.normal(size=(5, 8, 2)).astype("float32")) for i in range(1, 9)}
    order = [int(i) for _ in range(5) for i in rng.permutation(list(streams))]  # every stream once a round
    sent, answers, replicas = dict.fromkeys(streams, 0), {i: [] for i in streams}, {i: set() for i in streams}
    for i in order:
        t = sent[i]
        restarted = i == 3  # ends after its third window and starts again with its fourth
        start = t in (0, 3) if restarted else t == 0
        end = t in (2, 4) if restarted else t == 4
        change, replica = infer(triton_client, streams[i][t], i, start=start, end=end)
        answers[i].append(change)
        replicas[i].add(replica)
        sent[i] += 1
        time.sleep(float(rng.uniform(0, 0.2)))
    for i, windows in streams.items():
        segments = [windows[:3], windows[3:]] if i == 3 else [windows]
        expected = np.concatenate([batch_1_loop(weights, segment) for segment in segments])
        assert np.abs(np.array(answers[i]) - expected).max() < 1e-5, i
        assert len(replicas[i]) == 1, (i, replicas[i])  # every window on the replica that holds the stream


def post(url: str, body: bytes, path: str = f"/v2/models/{NAME}/infer") -> tuple[int, dict]:
    request = urllib.request.Request(f"http://{url}{path}", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_an_idle_stream_is_freed_and_bad_requests_are_one_line_while_serving_goes_on(server):
    url, weights = server
    triton_client = client(url)
    window = np.zeros((8, 2), "float32")
    infer(triton_client, window, "idle", start=True)
    time.sleep(IDLE_S + 1.0)
    code, body = post(url, json.dumps(request_json(window, sequence_id="idle")).encode())
    assert code == 400 and body["error"].startswith("sequence_start: expected true on the first window")
    corpus = [
        (b"{not json", 400, "body: expected a JSON inference request"),
        (json.dumps(request_json(window)).encode(), 400, "sequence_id: expected"),
        (json.dumps(request_json(window[:4], sequence_id=5)).encode(), 400, "inputs['co2_features'].shape"),
        (json.dumps(request_json(window, sequence_id=5)).replace("FP32", "INT64").encode(), 400, "inputs['co2_"),
        (json.dumps(request_json(window, sequence_id=6)).encode(), 400, "sequence_start: expected true"),
    ]
    for body_bytes, status, start in corpus:
        code, body = post(url, body_bytes)
        assert (code, body["error"][: len(start)]) == (status, start), body
    code, body = post(url, b"{}", path="/v2/models/unknown/infer")
    assert code == 404 and body["error"] == f"model: expected {NAME!r}, received 'unknown'"
    nan = window.copy()
    nan[0, 0] = np.nan  # answered, not refused: the model decides what a NaN gives
    assert np.isnan(infer(triton_client, nan, "nan", start=True, end=True)[0]).any()
    windows = list(np.random.default_rng(3).normal(size=(4, 8, 2)).astype("float32"))
    answers = [infer(triton_client, w, "after", start=t == 0, end=t == 3)[0] for t, w in enumerate(windows)]
    assert np.abs(np.array(answers) - batch_1_loop(weights, windows)).max() < 1e-5
    timed_out = lambda figures: figures.get("streams_timed_out_total", 0) >= 1  # noqa: E731
    assert timed_out(ray_metrics(timed_out))  # the idle stream, as the operator sees it


def request_json(window: np.ndarray, **parameters) -> dict:
    shape = [1, *window.shape]
    tensor = {"name": "co2_features", "shape": shape, "datatype": "FP32", "data": window.ravel().tolist()}
    return {"inputs": [tensor], "parameters": parameters}


def replica_pid(unique_id: str) -> int:
    """The process of the stream replica whose id answers name (`rayparallel_replica`), found by its actor name."""
    import ray

    (name,) = [
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["name"].startswith("SERVE_REPLICA::") and actor["name"].endswith(f"#{unique_id}")
    ]
    replica = ray.get_actor(name, namespace="serve")  # Ray Serve's own namespace
    return ray.get(replica.__ray_call__.remote(lambda _: os.getpid()))


def test_a_replica_killed_mid_stream_loses_no_stream_and_applies_each_window_once(server):
    """8 streams in threads (as many as one replica's slots: the survivor holds them all); the replica of stream 1
    is killed with SIGKILL after every stream's third window. Every window is answered, and each stream's
    answers equal the uninterrupted batch-1 loop: its moved streams go on from their last answered window."""
    url, weights = server
    rng = np.random.default_rng(21)
    streams = {i: list(rng.normal(size=(10, 8, 2)).astype("float32")) for i in range(101, 109)}
    answers, replicas, errors = {i: [] for i in streams}, {i: [] for i in streams}, {}
    third = threading.Barrier(len(streams) + 1)

    def send(i: int) -> None:
        triton_client = client(url)
        try:
            for t, window in enumerate(streams[i]):
                change, replica = infer(triton_client, window, i, start=t == 0, end=t == 9)
                answers[i].append(change)
                replicas[i].append(replica)
                if t == 2:
                    third.wait(timeout=120)
                time.sleep(0.05)
        except Exception as exc:  # kept for the assertion: a thread's error is otherwise only printed
            errors[i] = f"window {len(answers[i])}: {type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=send, args=(i,)) for i in streams]
    for thread in threads:
        thread.start()
    third.wait(timeout=120)
    victim = replicas[101][2]
    os.kill(replica_pid(victim), signal.SIGKILL)  # while the streams keep sending: some windows are in flight
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    # held by the victim when it died (a stream may have moved before: a replica that came up late moves the ring)
    moved = [i for i in streams if replicas[i][2] == victim]
    assert all(replicas[i][-1] != victim for i in moved), {i: replicas[i] for i in moved}
    for i, windows in streams.items():
        assert len(answers[i]) == len(windows), (i, len(answers[i]))  # a failed window ends its thread early
        assert np.abs(np.array(answers[i]) - batch_1_loop(weights, windows)).max() < 1e-5, i
    taken_over = lambda figures: figures.get("streams_taken_over_total", 0) >= len(moved)  # noqa: E731
    figures = ray_metrics(taken_over)  # the operator's view of it, in Prometheus' format
    assert taken_over(figures), figures
    assert figures.get("streams_started_total", 0) >= len(streams) - len(moved), figures
    assert figures.get("streams_ended_total", 0) >= 1 and figures.get("batch_fill_count", 0) >= 1, figures


def test_every_slot_of_the_deployment_takes_a_stream_and_one_more_waits_for_an_end(server):
    """2 replicas x 8 slots: 16 streams started at once are all answered (a start whose replica is full takes a
    free slot of the other, where its later windows find it); a 17th start waits, as in Triton's backlog, and
    is answered once a stream ends; every stream's answers equal its batch-1 loop."""
    from concurrent.futures import ThreadPoolExecutor

    from ray import serve

    url, weights = server
    front = serve.get_deployment_handle(f"{NAME}-front", NAME)
    assert wait_for(lambda: front.ready.remote().result() == 2, 300)  # the killed replica's successor is up
    time.sleep(IDLE_S + 1.0)  # the module's earlier streams idle past the timeout: every slot free
    rng = np.random.default_rng(31)
    streams = {i: list(rng.normal(size=(3, 8, 2)).astype("float32")) for i in range(201, 218)}
    answers: dict[int, list] = {i: [] for i in streams}

    def send(i: int, t: int, end: bool = False) -> str:
        change, replica = infer(client(url), streams[i][t], i, start=t == 0, end=end)
        answers[i].append(change)
        return replica

    first16 = list(streams)[:16]
    with ThreadPoolExecutor(17) as pool:
        placed = list(pool.map(lambda i: send(i, 0), first16))
        assert len(set(placed)) == 2, placed  # both replicas hold streams
        waiting = pool.submit(send, 217, 0)
        time.sleep(1.5)
        assert not waiting.done()  # every slot taken: the start waits
        send(201, 1, end=True)
        waiting.result(timeout=30)
        rest = [i for i in streams if i != 201]
        list(pool.map(lambda i: send(i, 1), rest))
        list(pool.map(lambda i: send(i, 2, end=True), rest))
    for i, windows in streams.items():
        expected = batch_1_loop(weights, windows[:2] if i == 201 else windows)
        assert np.abs(np.array(answers[i]) - expected).max() < 1e-5, i


def ray_metrics(ready, timeout_s: float = 60.0) -> dict[str, float]:
    """The stream replicas' `ray_rayparallel_serve_*` figures from this node's Prometheus endpoint, summed over
    the replicas, once `ready(figures)` (Ray exports every few seconds)."""
    import ray

    port = ray.nodes()[0]["MetricsExportPort"]
    deadline = time.monotonic() + timeout_s
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
            text = answer.read().decode()
        figures: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("ray_rayparallel_serve_") and "{" in line:
                name = line[len("ray_rayparallel_serve_") : line.index("{")]
                figures[name] = figures.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        if ready(figures) or time.monotonic() > deadline:
            return figures
        time.sleep(2.0)


def test_a_model_the_registry_does_not_have_is_one_line(default_job_runs):
    import rayparallel
    from rayparallel.errors import RayParallelError

    store = [f"mlflow.tracking_uri=sqlite:///{default_job_runs.cwd}/mlflow.db"]  # the training run's registry
    for uri, expected in [
        (f"models:/{NAME}@nope", f"--model: expected a registered model version, received 'models:/{NAME}@nope' ("),
        (f"models:/{NAME}/7", f"--model: expected a registered model version, received 'models:/{NAME}/7' ("),
    ]:
        with pytest.raises(RayParallelError) as info:
            rayparallel.serve("jobs/stateful_lstm.yaml", model=uri, overrides=store)
        assert str(info.value).startswith(expected) and "\n" not in str(info.value), str(info.value)


def test_the_serve_page_runs_as_written(default_job_runs, tmp_path):
    """docs/serve.md in the quick start's folder: its command (its own local Ray, as a user's first
    try starts one), then its `curl` and its Python block against it; Ctrl-C ends it (exit 130)."""
    import re
    import subprocess
    import sys

    from .helpers import RAYPARALLEL, doc_section

    blocks = re.findall(r"```(\w*)\n(.*?)```", doc_section("Serve (live streams)", "docs/serve.md"), re.S)
    (command,), (curl,), (python,) = ([b for lang, b in blocks if lang == kind] for kind in ("", "shell", "python"))
    assert command.strip() in doc_section("What a run prints and leaves")  # README's command is the same
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PATH"] = f"{os.path.dirname(RAYPARALLEL)}:{env['PATH']}"  # the installed script, as a user's shell finds it
    env.pop("MLFLOW_TRACKING_URI", None)  # MLflow's default store in the folder: where the quick start registered
    output = tmp_path / "serve.log"
    with open(output, "w") as log:
        server = subprocess.Popen(
            ["bash", "-c", f"exec {command.strip()}"], cwd=default_job_runs.cwd, env=env, stdout=log, stderr=log
        )
    try:
        deadline = time.monotonic() + 300
        while "rayparallel serve: up until Ctrl-C" not in output.read_text():
            assert server.poll() is None and time.monotonic() < deadline, output.read_text()[-3000:]
            time.sleep(1)
        answered = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=60)
        answer = json.loads(answered.stdout)
        assert answer["outputs"][0]["name"] == "change" and answer["outputs"][0]["shape"] == [1, 8, 1], answer
        script = tmp_path / "client.py"
        script.write_text(python)
        printed = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
        assert printed.returncode == 0, printed.stderr[-2000:]
        first = batch_1_loop(
            str(default_job_runs.cwd / "runs/stateful-lstm-co2/checkpoints"), [np.zeros((8, 2), "float32")]
        )
        values = np.array(printed.stdout.strip().strip("[]").split(), dtype="float32")
        assert np.abs(values - first[0, :, 0]).max() < 1e-4  # printed with numpy's precision
        assert np.abs(np.array(answer["outputs"][0]["data"]) - first[0, :, 0]).max() < 1e-5
    finally:
        server.send_signal(signal.SIGINT)
        code = server.wait(timeout=120)
    assert code == 130, output.read_text()[-3000:]
