"""Windows/s and latency of `rayparallel serve` under live streams, against the naive server and the ceiling.

Run: python -m benchmarks.serve [--streams 64 --seconds 20 --models small,large]

For each model (the default job's LSTM, 32 units over windows of 8; a larger stateful LSTM, 256 units over
windows of 32), a local Ray, 2 replicas, and `streams` live streams over loopback HTTP (KServe v2 JSON,
one aiohttp client in this process, each stream sending its next window once the previous is answered)
for `seconds`, and the same through the replicas' deployment handle (a caller inside Ray: no HTTP), against
four servers on the same HTTP ingress and sticky router:

- `rayparallel`: the stream replicas (`streams / 2` slots each), states kept outside the replicas;
- `rayparallel, states not kept`: the same, `keep_states=False` (what keeping them costs);
- `naive`: what a user would write: one batch-1 model a replica, each stream's state swapped in and out of
  a dict around one model call a request;
- `echo`: replicas that answer without a model (HTTP, the proxy and routing alone: the ceiling of this setup).

and the ceiling of the model itself: its batch-S step (all S slots, `SlotModel.step`) in a loop in one
process, no HTTP. The weights are the builder's own initial ones: speed does not depend on them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time

import numpy as np

from rayparallel.serve.ingress import KServeIngress

MODELS = {"small": {"window": 8, "units": 32}, "large": {"window": 32, "units": 256}}


class NaiveReplica:
    """One batch-1 model; a stream's state put in before its window and taken out after, one request at a time."""

    def __init__(self, recipe, weights, search_path: list[str], model: bool = True):
        from rayparallel.inference.batches import built_model
        from rayparallel.serve.slot_model import SlotModel

        self.model = SlotModel(built_model(recipe, weights, search_path, 1)) if model else None
        self.states: dict = {}
        self.lock = threading.Lock()

    def infer(self, stream, start: bool, end: bool, window: np.ndarray, token: str = ""):
        if self.model is None:  # echo: HTTP, the proxy and routing only
            return 200, {"change": np.zeros((window.shape[0], 1), "float32")}, ""
        with self.lock:
            if start:
                self.model.start(0)
            else:
                self.model.restore(0, self.states[stream])
            outputs = self.model.step({0: window})[0]
            self.states[stream] = self.model.states_of([0])[0]
            if end:
                self.states.pop(stream)
        return 200, outputs, ""


def application(kind: str, kwargs: dict, slots: int):
    """The Ray Serve application of `kind`, for the stateful LSTM built with `kwargs`."""
    from ray import serve

    from jobs.stateful_lstm import build_model
    from rayparallel.serve.app import ServeSettings, build, model_tensors, sticky_router
    from rayparallel.spec import ModelSpec

    recipe = ModelSpec("jobs.stateful_lstm:build_model", kwargs)
    model = build_model(slots, **kwargs)
    weights, search_path = model.get_weights(), [os.getcwd()]
    if kind.startswith("rayparallel"):
        settings = ServeSettings("lstm", "1", 2, slots, 60.0, 5.0, keep_states=kind == "rayparallel")
        return build(recipe, weights, search_path, model, settings)
    replicas = serve.deployment(
        NaiveReplica,
        name="lstm-streams",
        num_replicas=2,
        request_router_config=sticky_router(),
        max_ongoing_requests=1000,
    ).bind(recipe, weights, search_path, kind == "naive")
    model_input, outputs = model_tensors(model)
    ingress = serve.deployment(
        KServeIngress, name="lstm-http", ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1000
    )
    return ingress.bind(replicas, "lstm", "1", model_input, outputs, False)


async def load(url: str, streams: int, seconds: float, window: int) -> tuple[int, list[float], int]:
    """Windows answered, their latencies (s), and failed requests, of `streams` streams for `seconds`."""
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

    connector = aiohttp.TCPConnector(limit=streams + 4)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(stream(session, i) for i in range(streams)))
    return len(latencies), latencies, failed


async def load_handle(handle, streams: int, seconds: float, window: int) -> tuple[int, list[float], int]:
    """`load` through the stream replicas' deployment handle (a caller inside Ray): no HTTP, no proxy."""
    windows = np.random.default_rng(0).normal(size=(streams, window, 2)).astype("float32")
    latencies: list[float] = []
    failed = 0
    deadline = time.perf_counter() + seconds

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

    await asyncio.gather(*(stream(i) for i in range(streams)))
    return len(latencies), latencies, failed


def served(kind: str, kwargs: dict, streams: int, seconds: float, port: int) -> dict:
    """Both transports' figures for one server: HTTP (`http_*`) and the deployment handle (`handle_*`)."""
    from ray import serve

    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(application(kind, kwargs, slots(streams)), name="lstm", route_prefix="/")
    url = f"http://127.0.0.1:{port}/v2/models/lstm"
    handle = serve.get_deployment_handle("lstm-streams", "lstm")
    figures = {}
    for transport, run in [
        ("http", lambda s: load(url, streams, s, kwargs["window"])),
        ("handle", lambda s: load_handle(handle, streams, s, kwargs["window"])),
    ]:
        asyncio.run(run(2.0))  # warm: every stream started, the steps traced
        windows, latencies, failed = asyncio.run(run(seconds))
        milliseconds = np.array(latencies) * 1000
        figures[transport] = {
            "windows_per_s": windows / seconds,
            "p50_ms": float(np.percentile(milliseconds, 50)),
            "p99_ms": float(np.percentile(milliseconds, 99)),
            "failed": failed,
        }
    serve.delete("lstm")
    return figures


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
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--models", default="small,large")
    parser.add_argument("--port", type=int, default=8341)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    figures: dict = {}
    for name in args.models.split(","):
        kwargs = MODELS[name]
        figures[name] = {"ceiling": ceiling(kwargs, slots(args.streams), args.seconds / 2)}
        for kind in ("rayparallel", "rayparallel, states not kept", "naive", "echo"):
            figures[name][kind] = served(kind, kwargs, args.streams, args.seconds, args.port)
            print(name, kind, json.dumps(figures[name][kind]), flush=True)
        report(name, kwargs, figures[name])
    if args.json:
        with open(args.json, "w") as file:
            json.dump(figures, file, indent=1)


def report(name: str, kwargs: dict, figures: dict) -> None:
    print(f"\n{name} model {kwargs}: windows/s, p50 / p99 ms; the model's ceiling {figures['ceiling']:.0f} windows/s")
    for transport in ("http", "handle"):
        for kind, row in figures.items():
            if kind != "ceiling":
                row = row[transport]
                latency = f"{row['p50_ms']:.1f} / {row['p99_ms']:.1f} ms"
                print(f"  {transport:6s} {kind:30s} {row['windows_per_s']:9.1f}  {latency}  failed {row['failed']}")
        ours, naive = figures["rayparallel"][transport], figures["naive"][transport]
        unkept = figures["rayparallel, states not kept"][transport]
        print(
            f"  {transport}: {ours['windows_per_s'] / naive['windows_per_s']:.2f}x the naive server; keeping states "
            f"costs {1 - ours['windows_per_s'] / unkept['windows_per_s']:.1%}; "
            f"{ours['windows_per_s'] / figures['ceiling']:.2f} of the model's ceiling, "
            f"{ours['windows_per_s'] / figures['echo'][transport]['windows_per_s']:.2f} of echo's"
        )


if __name__ == "__main__":
    main()
