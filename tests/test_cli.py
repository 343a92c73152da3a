"""`rayparallel train` end to end: the default job, as a user runs it, on the session's Ray."""

from __future__ import annotations

import json

import numpy as np
import pytest

from .conftest import cli

pytestmark = pytest.mark.slow


def test_default_job_1_and_2_workers_same_weights_and_beats_naive(ray_address, tmp_path):
    import keras

    from jobs.stateful_lstm import build_model

    results, weights = {}, {}
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        run = cli("train", "jobs/stateful_lstm.yaml", "--set", f"scaling.num_workers={workers}",
                  "--set", "train.epochs=3", "--output-dir", str(out), env={"RAY_ADDRESS": ray_address})
        assert run.returncode == 0, run.stderr[-3000:]
        assert "Epoch 3/3" in run.stdout and "samples/s" in run.stdout
        assert "baseline naive (last value carried forward): val_loss" in run.stdout
        results[workers] = json.loads((out / "result.json").read_text())
        model = build_model(batch_size=1)
        model.load_weights(results[workers]["final_weights"])
        weights[workers] = model.get_weights()

    error = max(float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in zip(weights[2], weights[1]))
    print(f"default job: 2 workers vs 1 after 3 epochs, max relative weight error {error:.2e}")
    assert error < 1e-5
    two = results[2]
    assert len(two["history"]) == 3
    assert {"loss", "val_loss", "mae", "val_mae"} <= set(two["history"][-1])
    assert [(w["rank"], w["batch_shape"]) for w in two["workers"]] == [(0, [[4, 8, 2]]), (1, [[4, 8, 2]])]
    assert all(w["node_id"] and w["gpu_ids"] == [] for w in two["workers"])
    naive = two["baselines"]["naive (last value carried forward)"]["val_loss"]
    assert two["history"][-1]["val_loss"] < 0.5 * naive
    assert keras.__version__.startswith("3.")
