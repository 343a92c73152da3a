"""Rows/s of `rayparallel.predict` on 1 and 2 workers against Keras in one process, same rows.

Run: python -m benchmarks.predict [--streams 64 --windows 200 --images 20000]

Two models: the default job's stateful LSTM (`jobs.stateful_lstm`) over `streams` streams of
`windows` windows each, against one process running all streams as one stateful batch in
time order; and the VGG classifier (`jobs.vgg_classifier`) over `images` rows, against
`model.predict(x, batch_size=256)`. The weights are the builders' own initial ones (speed
does not depend on their values). rayparallel's figure is end to end (a local Ray started,
workers started, TensorFlow imported in each, Parquet written), and `PredictResult.rows_per_s`
counts from the workers' start.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np


def stream_rows(global_batch_size: int, windows: int = 200, window: int = 8) -> dict:
    """`windows` windows of `global_batch_size` streams, laid out as the default job's loader does."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(windows * global_batch_size, window, 2)).astype("float32")
    return {
        "x_train": x[:global_batch_size],
        "y_train": np.zeros((global_batch_size, window, 1), "float32"),
        "x_val": x,
    }


def image_rows(images: int = 20000) -> dict:
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(images, 16, 16, 1)).astype("float32")
    return {"x_train": x[:64], "y_train": np.zeros(64, "int64"), "x_val": x}


def _weights(folder: Path, builder: str, kwargs: dict) -> str:
    from rayparallel.spec.references import resolve

    folder.mkdir(parents=True, exist_ok=True)
    resolve(builder, "model.builder")(batch_size=1, **kwargs).save_weights(str(folder / "final.weights.h5"))
    manifest = {
        "model": {"builder": builder, "kwargs": kwargs},
        "checkpoints": [],
        "final": {"file": "final.weights.h5"},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return str(folder)


def keras_streams(weights: str, x: np.ndarray, streams: int) -> float:
    import rayparallel

    model = rayparallel.load_model(weights, batch_size=streams)
    started = time.perf_counter()
    for t in range(len(x) // streams):
        model.predict_on_batch(x[t * streams : (t + 1) * streams])
    return len(x) / (time.perf_counter() - started)


def keras_rows(weights: str, x: np.ndarray) -> float:
    import rayparallel

    model = rayparallel.load_model(weights, batch_size=256)
    started = time.perf_counter()
    model.predict(x, batch_size=256, verbose=0)
    return len(x) / (time.perf_counter() - started)


def measure(streams: int, windows: int, images: int) -> dict:
    import rayparallel

    root = Path(tempfile.mkdtemp(prefix="rayparallel-predict-bench-"))
    lstm = {
        "name": "bench-streams",
        "model": {"builder": "jobs.stateful_lstm:build_model", "kwargs": {"window": 8, "units": 32}},
        "data": {
            "loader": "benchmarks.predict:stream_rows",
            "kwargs": {"windows": windows},
            "layout": "streams",
        },
        "train": {"global_batch_size": streams},
        "mlflow": {"enabled": False},
    }
    vgg = {
        "name": "bench-rows",
        "model": {"builder": "jobs.vgg_classifier:build_model", "kwargs": {"filters": 32, "dense": 128}},
        "data": {"loader": "benchmarks.predict:image_rows", "kwargs": {"images": images}},
        "train": {"global_batch_size": 64},
        "predict": {"batch_size": 256},
        "mlflow": {"enabled": False},
    }
    figures = {}
    for name, job, keras in (
        ("stateful_lstm", lstm, lambda w: keras_streams(w, stream_rows(streams, windows)["x_val"], streams)),
        ("vgg_classifier", vgg, lambda w: keras_rows(w, image_rows(images)["x_val"])),
    ):
        weights = _weights(root / name, job["model"]["builder"], job["model"]["kwargs"])
        figures[name] = {"keras_one_process_rows_per_s": round(keras(weights), 1)}
        for workers in (1, 2):
            started = time.perf_counter()
            result = rayparallel.predict(
                job, weights=weights, out=root / f"{name}-{workers}", split="val", num_workers=workers, verbose=False
            )
            total = time.perf_counter() - started
            figures[name][f"{workers}w"] = {
                "rows": result.rows,
                "end_to_end_rows_per_s": round(result.rows / total, 1),
                "from_workers_start_rows_per_s": result.rows_per_s,
                "seconds": round(total, 1),
            }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--windows", type=int, default=200)
    parser.add_argument("--images", type=int, default=20000)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    print(json.dumps(measure(args.streams, args.windows, args.images), indent=2))


if __name__ == "__main__":
    main()
