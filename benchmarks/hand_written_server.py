"""The server a user writes by hand instead of `rayparallel serve`: the anchor of `benchmarks/serve.py`.

One process, no Ray: the model rebuilt at batch 1, one compiled call (`tf.function`) a request, each
stream's state kept in a dict and swapped in around the call, KServe v2 JSON with Triton's sequence
parameters over aiohttp. It never batches two streams into one step. Run:
`python -m benchmarks.hand_written_server --port 8400 --window 8 --units 32` (prints `ready` when up).
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8400)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--units", type=int, default=32)
    args = parser.parse_args()

    import keras
    import tensorflow as tf
    from aiohttp import web

    from jobs.stateful_lstm import build_model

    model = build_model(1, window=args.window, units=args.units)
    states = [v for layer in model.layers if getattr(layer, "stateful", False) for v in layer.states]
    zeros = [np.zeros(v.shape, v.dtype) for v in states]
    kept: dict = {}

    @tf.function
    def step(x, state):
        for variable, value in zip(states, state, strict=True):
            variable.assign(value)
        y = model(x, training=False)
        return y, [tf.identity(variable.value) for variable in states]

    async def infer(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        params = body.get("parameters", {})
        stream = params["sequence_id"]
        if not params.get("sequence_start") and stream not in kept:
            return web.json_response({"error": f"sequence {stream} not started"}, status=400)
        tensor = body["inputs"][0]
        x = np.asarray(tensor["data"], np.float32).reshape(tensor["shape"])
        y, kept[stream] = step(x, zeros if params.get("sequence_start") else kept[stream])
        if params.get("sequence_end"):
            kept.pop(stream, None)
        out = {"name": "change", "datatype": "FP32", "shape": list(y.shape), "data": y.numpy().ravel().tolist()}
        return web.json_response({"model_name": "lstm", "outputs": [out]})

    keras.utils.set_random_seed(0)
    app = web.Application()
    app.router.add_post("/v2/models/lstm/infer", infer)
    print("ready", flush=True)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
