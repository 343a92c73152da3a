"""What `mlflow.log_checkpoints: true` costs per checkpoint: one MLflow logged model (the Keras
flavor, its environment files, the run's figures linked), as the recorder's delivery thread logs
it, off the step. Measured into a local sqlite store, for the default job's LSTM and a 50M-weight
dense net.

Run: python -m benchmarks.logged_models [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def measure(repeats: int = 3) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from mlflow.tracking import MlflowClient

    from benchmarks.models import dense_50m
    from jobs.stateful_lstm import build_model

    folder = Path(tempfile.mkdtemp(prefix="rayparallel-bench-"))
    uri = f"sqlite:///{folder}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("bench", artifact_location=(folder / "mlruns").as_uri())
    figures = {}
    try:
        for name, model in (("default job LSTM", build_model(1)), ("dense 50M", dense_50m())):
            figures[name] = _per_checkpoint(client, uri, experiment, model, repeats)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return figures


def _per_checkpoint(client, uri: str, experiment: str, model, repeats: int) -> dict:
    from rayparallel.tracking.keras_models import CHECKPOINT_TAG, log_keras_model

    run = client.create_run(experiment).info.run_id
    log_keras_model(uri, run, model, name="warm-up")  # MLflow's and the flavor's imports, once
    seconds = []
    for epoch in range(1, repeats + 1):
        client.log_metric(run, "val_loss", 1.0 / epoch, step=epoch)
        started = time.perf_counter()
        tags = {CHECKPOINT_TAG: f"epoch-{epoch:03d}.weights.h5"}
        log_keras_model(uri, run, model, name=f"epoch-{epoch:03d}", step=epoch, tags=tags)
        seconds.append(time.perf_counter() - started)
    return {"params": model.count_params(), "seconds_per_checkpoint": statistics.median(seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    for name, figures in measure(parser.parse_args().repeats).items():
        print(f"{name} ({figures['params']:,} weights): {figures['seconds_per_checkpoint']:.2f} s per logged model")


if __name__ == "__main__":
    main()
