"""`rayparallel train` end to end: the default job, as a user runs it, on the session's Ray."""

from __future__ import annotations

import pytest

from .helpers import max_relative_error

pytestmark = pytest.mark.slow


def test_default_job_1_and_2_workers_same_weights_and_beats_naive(default_job_runs):
    runs = default_job_runs
    for workers in (1, 2):
        assert "Epoch 3/3" in runs.stdout[workers] and "samples/s" in runs.stdout[workers]
        assert "baseline naive (last value carried forward): val_loss" in runs.stdout[workers]
        quiet = runs.stdout[workers] + runs.stderr[workers]  # no TensorFlow or Ray start-up chatter
        for notice in ("cuInit", "oneDNN", "absl::InitializeLog", "cpu_feature_guard", "Started a local Ray"):
            assert notice not in quiet, notice
    one, two = (runs.weights(runs.results[w]["final_weights"]) for w in (1, 2))
    error = max_relative_error(two, one)
    print(f"default job: 2 workers vs 1 after 3 epochs, max relative weight error {error:.2e}")
    assert error < 1e-5
    result = runs.results[2]
    assert len(result["history"]) == 3
    assert {"loss", "val_loss", "mae", "val_mae"} <= set(result["history"][-1])
    assert [(w["rank"], w["batch_shape"]) for w in result["workers"]] == [(0, [[4, 8, 2]]), (1, [[4, 8, 2]])]
    assert all(w["node_id"] and w["gpu_ids"] == [] for w in result["workers"])
    naive = result["baselines"]["naive (last value carried forward)"]["val_loss"]
    assert result["history"][-1]["val_loss"] < 0.5 * naive
