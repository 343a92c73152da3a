"""Memory and speed of the data paths: Ray Data shards against the shared in-memory loader.

    python -m benchmarks.data_scale [--quick] [--json PATH] [--keep DIR]

Writes a synthetic regression dataset (4 GiB, or 1 GiB with --quick) as parquet files in a
temporary folder, then trains the same model on it twice on 2 workers, 3 epochs each, in one
local Ray: through the in-memory loader (`data.loader`, the same rows generated from the same
seed; at most the first 1 GiB, see `memory_files`) and through Ray Data (`data.dataset`). It
reports:

- dataset_bytes: the rows as arrays in memory (features and labels);
- data_pss_per_worker_over_dataset: Ray Data run, the largest over the workers of (peak PSS
  minus PSS before any data) over dataset_bytes (result.json `workers[].memory`);
- inmemory_data_pss_node_over_dataset: in-memory run, the object store's copy of the arrays
  (dataset_bytes, once for the node) plus each worker's growth outside the object store
  (result.json `pss_object_store_mb`: its share of the store's pages, which PSS splits among
  the processes that map them), over dataset_bytes;
- raydata_vs_inmemory_throughput: samples/s of the last epoch, Ray Data over in-memory;
- input_wait_fraction: the Ray Data run's last epoch, the share of the epoch rank 0 waited
  for its next batch;
- epoch_start_wait_s: the Ray Data run, the wait for the first batch of every epoch after the
  first, median over workers and epochs (result.json `workers[].epoch_start_wait_s`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

FEATURES = 256
ROWS_PER_FILE = 65536  # 64 MiB of features a file
GLOBAL_BATCH = 1024


def build_model(batch_size: int, features: int = FEATURES):
    import keras

    inputs = keras.Input(batch_shape=(batch_size, features))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1)(hidden))


def _chunk(index: int, rows: int, features: int) -> tuple[np.ndarray, np.ndarray]:
    """File `index`'s rows: the same from the writer and the loader."""
    rng = np.random.default_rng(index)
    x = rng.standard_normal((rows, features), dtype="float32")
    y = (x[:, :8].sum(axis=1, keepdims=True) + 0.1 * rng.standard_normal((rows, 1), dtype="float32")).astype("float32")
    return x, y


def load_arrays(files: int, features: int = FEATURES) -> dict:
    """The in-memory loader: every row, generated as the files were written."""
    x = np.empty((files * ROWS_PER_FILE, features), "float32")
    y = np.empty((files * ROWS_PER_FILE, 1), "float32")
    for i in range(files):
        rows = slice(i * ROWS_PER_FILE, (i + 1) * ROWS_PER_FILE)
        x[rows], y[rows] = _chunk(i, ROWS_PER_FILE, features)
    return {"x_train": x, "y_train": y}


def read_dataset(path: str):
    """`data.dataset`: the parquet folder, read as Ray Data streams it."""
    import ray.data

    return ray.data.read_parquet(path)


def write_dataset(folder: Path, files: int, features: int = FEATURES) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from ray.data.extensions import ArrowTensorArray

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        x, y = _chunk(i, ROWS_PER_FILE, features)
        table = pa.table({"x": ArrowTensorArray.from_numpy(x), "y": ArrowTensorArray.from_numpy(y)})
        pq.write_table(table, folder / f"part-{i:04d}.parquet", compression="none")
        print(f"  wrote {i + 1}/{files} files", end="\r", flush=True)
    print()
    return files * ROWS_PER_FILE * (features + 1) * 4


def job(name: str, data: dict) -> dict:
    return {
        "name": name,
        "model": {"builder": "benchmarks.data_scale:build_model"},
        "data": {**data, "layout": "shuffle"},
        "train": {"global_batch_size": GLOBAL_BATCH, "epochs": 3, "seed": 0, "optimizer": "adam"},
        "scaling": {"num_workers": 2},
        "checkpoint": {"enabled": False},
        "mlflow": {"enabled": False},
    }


def worker_growth(result, without_object_store: bool = False) -> list[float]:
    """Each worker's PSS growth from before its data to its peak, in bytes; optionally without its share of
    the object store's pages (which the node pays once, as the object's size)."""
    growth = []
    for worker in result.workers:
        memory = worker["memory"]
        shared = memory["pss_object_store_mb"] if without_object_store else 0.0
        growth.append((memory["pss_peak_mb"] - memory["pss_before_data_mb"] - shared) * 2**20)
    return growth


def later_epoch_starts(result) -> list[float]:
    """Every worker's wait for the first batch of each epoch after the first (the first starts Ray Data)."""
    return [wait for worker in result.workers for wait in worker["epoch_start_wait_s"][1:]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 GiB instead of 4 GiB")
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument("--keep", help="write the dataset here and keep it (default: a temporary folder)")
    args = parser.parse_args()

    import os

    import ray

    import rayparallel

    files = 16 if args.quick else 64
    # the in-memory run holds the loader's copy in the driver and one in the object store (capped below):
    # it compares on at most 1 GiB; the figures are ratios
    memory_files = min(files, 16)
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="rayparallel-data-scale-"))
    started = time.time()
    print(f"data_scale: writing {files} parquet files to {root}")
    dataset_bytes = write_dataset(root / "rows", files)
    memory_bytes = dataset_bytes * memory_files // files
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{root}/mlflow.db")
    # 2 workers and 1 CPU for Ray Data's tasks (rayparallel's own local Ray leaves one too). The object store
    # is capped at 3 GiB, as on a node that does not hold the dataset: Ray Data keeps its blocks in flight
    # within it, and the in-memory side's arrays (at most 1 GiB) fit
    ray.init(
        address="local",
        num_cpus=3,
        object_store_memory=3 * 2**30,
        include_dashboard=False,
        log_to_driver=False,
        logging_level="ERROR",
    )
    try:
        print("data_scale: in-memory loader, 2 workers")
        loader = job(
            "data-scale-inmemory", {"loader": "benchmarks.data_scale:load_arrays", "kwargs": {"files": memory_files}}
        )
        inmemory = rayparallel.train(loader, output_dir=root / "inmemory", verbose=False)

        print("data_scale: Ray Data, 2 workers")
        streamed = job(
            "data-scale-raydata",
            {"dataset": "benchmarks.data_scale:read_dataset", "kwargs": {"path": str(root / "rows")}},
        )
        raydata = rayparallel.train(streamed, output_dir=root / "raydata", verbose=False)
    finally:
        ray.shutdown()
        if not args.keep:  # gigabytes of parquet; the figures are printed (and in --json)
            shutil.rmtree(root, ignore_errors=True)

    figures = {
        "dataset_bytes": dataset_bytes,
        "data_pss_per_worker_over_dataset": round(max(worker_growth(raydata)) / dataset_bytes, 4),
        # the object store holds the arrays once (dataset_bytes), whichever processes map its pages
        "inmemory_data_pss_node_over_dataset": round(
            (memory_bytes + sum(worker_growth(inmemory, without_object_store=True))) / memory_bytes, 4
        ),
        "raydata_vs_inmemory_throughput": round(
            raydata.history[-1]["samples_per_s"] / inmemory.history[-1]["samples_per_s"], 4
        ),
        "input_wait_fraction": round(raydata.history[-1]["input_wait_fraction"], 4),
        "epoch_start_wait_s": round(statistics.median(later_epoch_starts(raydata)), 3),
        "details": {
            "epoch_start_wait_s_by_worker": [w["epoch_start_wait_s"] for w in raydata.workers],
            "rows": files * ROWS_PER_FILE,
            "inmemory_rows": memory_files * ROWS_PER_FILE,
            "global_batch_size": GLOBAL_BATCH,
            "inmemory_worker_growth_mb": [round(b / 2**20) for b in worker_growth(inmemory)],
            "inmemory_worker_growth_outside_object_store_mb": [
                round(b / 2**20) for b in worker_growth(inmemory, without_object_store=True)
            ],
            "raydata_worker_growth_mb": [round(b / 2**20) for b in worker_growth(raydata)],
            "samples_per_s": {
                "inmemory": inmemory.history[-1]["samples_per_s"],
                "raydata": raydata.history[-1]["samples_per_s"],
            },
            "inmemory_input_wait_fraction": inmemory.history[-1]["input_wait_fraction"],
            "seconds": round(time.time() - started, 1),
        },
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
