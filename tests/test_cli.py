"""`rayparallel train` end to end: the default job, as a user runs it, on the session's Ray."""

from __future__ import annotations

import pytest
import yaml

from .helpers import REPO, keras_fit_streams, max_relative_error

pytestmark = pytest.mark.slow


def test_default_job_on_2_workers_trains_fits_model_and_beats_naive(default_job_runs):
    """The README's default job against plain Keras `fit` of the same job in this process: its history (Adam),
    and its weights within 1e-4 (2.8e-7 measured: this LSTM does not amplify Adam's round-off as some nets do)."""
    runs = default_job_runs
    stdout, stderr = runs.stdout[2], runs.stderr[2]
    assert "Epoch 3/3" in stdout and "samples/s" in stdout
    assert "baseline naive (last value carried forward): val_loss" in stdout
    for notice in ("cuInit", "oneDNN", "absl::InitializeLog", "cpu_feature_guard", "Started a local Ray"):
        assert notice not in stdout + stderr, notice  # no TensorFlow or Ray start-up chatter
    spec = yaml.safe_load((REPO / "jobs/stateful_lstm.yaml").read_text())
    spec["train"]["epochs"] = 3
    model, history = keras_fit_streams(spec)
    result = runs.results[2]
    error = max_relative_error(runs.weights(result["final_weights"]), model.get_weights())
    print(f"default job: 2 workers vs Keras fit after 3 epochs, max relative weight error {error:.2e}")
    assert error < 1e-4
    for key, values in history.items():
        assert [epoch[key] for epoch in result["history"]] == pytest.approx(values, rel=1e-4, abs=1e-6), key
    assert {"loss", "val_loss", "mae", "val_mae"} <= set(result["history"][-1])
    assert [(w["rank"], w["batch_shape"]) for w in result["workers"]] == [(0, [[4, 8, 2]]), (1, [[4, 8, 2]])]
    assert all(w["node_id"] and w["gpu_ids"] == [] for w in result["workers"])
    naive = result["baselines"]["naive (last value carried forward)"]["val_loss"]
    assert result["history"][-1]["val_loss"] < 0.5 * naive
