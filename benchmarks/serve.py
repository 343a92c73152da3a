"""Windows/s, latency and CPU per window of `rayparallel serve` under live streams, against the server a user
writes by hand.

Run: python -m benchmarks.serve [--streams 8,32,64 --seconds 15 --models small,large --json PATH]

For each model (the default job's LSTM, 32 units over windows of 8; a larger stateful LSTM, 256 units over
windows of 32) and each count of live streams, over loopback HTTP (KServe v2 JSON, one aiohttp client in this
process, each stream sending its next window once the previous is answered and a gap of 0-50 ms has passed):

- `hand-written`: the anchor, `benchmarks/hand_written_server.py`: one process, no Ray, the model at batch 1
  behind one compiled call a request, each stream's state in a dict (what a user writes instead);
- `rayparallel`: `rayparallel serve`'s application on a local Ray, 2 replicas (`streams / 2` slots each and
  half again), states kept: the front (HAProxy) -> each replica's own HTTP server -> its slots' step;
- `rayparallel, states not kept`: the same, `keep_states=False` (what keeping them costs);

and `rayparallel` through the replicas' deployment handle (a caller inside Ray: no HTTP), and the ceiling of
the model itself: its batch-S step (all S slots, `SlotModel.step`) in a loop in one process, no HTTP. CPU per
window is every process's on this machine but the load generator's (the server's, whatever processes it
has: HAProxy, the replicas, the keeper, Ray's own). The weights are the builder's initial ones: speed does
not depend on them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import numpy as np

MODELS = {"small": {"window": 8, "units": 32}, "large": {"window": 32, "units": 256}}
KINDS = ("hand-written", "rayparallel", "rayparallel, states not kept")


GAP_S = 0.05  # a stream waits between 0 and this long (uniform) before its next window: live streams, not a flood


async def load(url: str, streams: int, seconds: float, window: int) -> tuple[int, list[float], int]:
    """Windows answered, their latencies (s), and failed requests, of `streams` streams for `seconds`, each
    sending its next window once the last is answered and a random gap (0 to `GAP_S`) has passed."""
    import aiohttp

    rng = np.random.default_rng(0)
    data = rng.normal(size=(streams, window * 2)).astype("float32").round(4).tolist()
    latencies: list[float] = []
    failed = 0
    deadline = time.perf_counter() + seconds

    async def stream(session, i: int) -> None:
        nonlocal failed
        t = 0
        while time.perf_counter() < deadline:
            tensor = {"name": "co2_features", "shape": [1, window, 2], "datatype": "FP32", "data": data[i]}
            body = {"inputs": [tensor], "parameters": {"sequence_id": i + 1, "sequence_start": t == 0}}
            began = time.perf_counter()
            async with session.post(f"{url}/infer", data=json.dumps(body)) as answer:
                await answer.read()
                if answer.status == 200:
                    latencies.append(time.perf_counter() - began)
                else:
                    failed += 1
            t += 1
            await asyncio.sleep(GAP_S * gaps.random())

    gaps = np.random.default_rng(1)
    connector = aiohttp.TCPConnector(limit=streams + 4)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(stream(session, i) for i in range(streams)))
    return len(latencies), latencies, failed


async def load_handle(handle, streams: int, seconds: float, window: int) -> tuple[int, list[float], int]:
    """`load` through the stream replicas' deployment handle (a caller inside Ray): no HTTP, no front."""
    windows = np.random.default_rng(0).normal(size=(streams, window, 2)).astype("float32")
    latencies: list[float] = []
    failed = 0
    deadline = time.perf_counter() + seconds
    gaps = np.random.default_rng(1)

    async def stream(i: int) -> None:
        nonlocal failed
        sticky, t = handle.options(session_id=str(i + 1)), 0
        while time.perf_counter() < deadline:
            began = time.perf_counter()
            status, _, _ = await sticky.infer.remote(i + 1, t == 0, False, windows[i])
            if status == 200:
                latencies.append(time.perf_counter() - began)
            else:
                failed += 1
            t += 1
            await asyncio.sleep(GAP_S * gaps.random())

    await asyncio.gather(*(stream(i) for i in range(streams)))
    return len(latencies), latencies, failed


def served(kind: str, kwargs: dict, streams: int, seconds: float, port: int) -> dict:
    """One server's figures: over HTTP (`http`), and for rayparallel through the deployment handle (`handle`)."""
    if kind == "hand-written":
        return hand_written(kwargs, streams, seconds, port)
    from ray import serve

    from jobs.stateful_lstm import build_model
    from rayparallel.serve.app import ServeSettings, build
    from rayparallel.spec import ModelSpec

    recipe, model = ModelSpec("jobs.stateful_lstm:build_model", kwargs), build_model(slots(streams), **kwargs)
    keep = kind == "rayparallel"
    settings = ServeSettings("lstm", "1", 2, slots(streams), 60.0, 5.0, keep_states=keep, port=port)
    serve.start(proxy_location="Disabled")
    front = serve.run(
        build(recipe, model.get_weights(), [os.getcwd()], model, settings), name="lstm", route_prefix=None
    )
    while front.ready.remote().result() < 2:
        time.sleep(0.5)
    url = f"http://127.0.0.1:{port}/v2/models/lstm"
    figures = {"http": measured(lambda s: load(url, streams, s, kwargs["window"]), seconds)}
    if keep:
        handle = serve.get_deployment_handle("lstm-streams", "lstm")
        figures["handle"] = measured(lambda s: load_handle(handle, streams, s, kwargs["window"]), seconds)
    serve.delete("lstm")
    return figures


def hand_written(kwargs: dict, streams: int, seconds: float, port: int) -> dict:
    """The anchor: `benchmarks/hand_written_server.py` in a process of its own, under the same HTTP load."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "benchmarks.hand_written_server", "--port", str(port)]
    command += ["--window", str(kwargs["window"]), "--units", str(kwargs["units"])]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        server.stdout.readline()  # "ready": the model is built; the port opens a moment later
        import socket

        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/v2/models/lstm"
        return {"http": measured(lambda s: load(url, streams, s, kwargs["window"]), seconds)}
    finally:
        server.terminate()
        server.wait(timeout=30)


def measured(run, seconds: float) -> dict:
    """`run(seconds)`'s windows/s, p50 and p99 (ms), and the CPU seconds a window costs every process on this
    machine but this one (the load generator): the server's, whatever processes it has."""
    import psutil

    asyncio.run(run(2.0))  # warm: every stream started, the steps traced
    me = psutil.Process()
    machine, own = psutil.cpu_times(), me.cpu_times()
    windows, latencies, failed = asyncio.run(run(seconds))
    machine_after, own_after = psutil.cpu_times(), me.cpu_times()
    busy = (machine_after.user + machine_after.system) - (machine.user + machine.system)
    server_cpu = busy - ((own_after.user + own_after.system) - (own.user + own.system))
    milliseconds = np.array(latencies) * 1000
    return {
        "windows_per_s": windows / seconds,
        "p50_ms": float(np.percentile(milliseconds, 50)),
        "p99_ms": float(np.percentile(milliseconds, 99)),
        "cpu_ms_per_window": 1000 * server_cpu / max(windows, 1),
        "failed": failed,
    }


def slots(streams: int) -> int:
    """Slots a replica: half the streams and half again, as the hash ring does not split them evenly."""
    return (streams // 2) * 3 // 2


def ceiling(kwargs: dict, slots: int, seconds: float) -> float:
    """Windows/s of the model's batch-`slots` step over every slot, in a loop in this process (all its cores)."""
    from jobs.stateful_lstm import build_model
    from rayparallel.serve.slot_model import SlotModel

    model = SlotModel(build_model(slots, **kwargs))
    windows = {slot: np.zeros(model.window_shape, "float32") for slot in range(slots)}
    model.step(windows)
    steps, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        model.step(windows)
        steps += 1
    return steps * slots / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="8,32,64", help="counts of live streams, comma-separated")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--models", default="small,large")
    parser.add_argument("--port", type=int, default=8341)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    import ray

    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    figures: dict = {}
    for name in args.models.split(","):
        kwargs = MODELS[name]
        for streams in map(int, args.streams.split(",")):
            row = figures.setdefault(name, {})[streams] = {}
            row["ceiling"] = ceiling(kwargs, slots(streams), min(args.seconds / 2, 5.0))
            for kind in KINDS:
                row[kind] = served(kind, kwargs, streams, args.seconds, args.port)
                print(name, streams, kind, json.dumps(row[kind]), flush=True)
            report(name, kwargs, streams, row)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(figures, file, indent=1)


def report(name: str, kwargs: dict, streams: int, figures: dict) -> None:
    ceiling_line = f"the model's ceiling {figures['ceiling']:.0f} windows/s"
    print(f"\n{name} model {kwargs}, {streams} streams: windows/s, p50 / p99 ms, CPU ms a window; {ceiling_line}")
    for kind in KINDS:
        for transport, row in figures[kind].items():
            latency = f"{row['p50_ms']:.1f} / {row['p99_ms']:.1f} ms"
            label = f"{kind} ({transport})"
            print(
                f"  {label:38s} {row['windows_per_s']:8.1f}  {latency:20s} {row['cpu_ms_per_window']:.2f}  failed {row['failed']}"
            )
    ours, theirs = figures["rayparallel"]["http"], figures["hand-written"]["http"]
    print(
        f"  rayparallel: {ours['windows_per_s'] / theirs['windows_per_s']:.2f}x the hand-written server's windows/s, "
        f"{ours['p99_ms'] / theirs['p99_ms']:.2f}x its p99"
    )


if __name__ == "__main__":
    main()
