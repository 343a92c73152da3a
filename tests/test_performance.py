"""Gradient compression and start-up phases (real Ray, real TF); speed itself is measured by
`python -m benchmarks.run`, not here."""

from __future__ import annotations

import pytest

import rayparallel
from rayparallel.startup import PHASES
from tests.models import lstm_job

from .helpers import final_weights, keras_fit_streams, max_relative_error

pytestmark = pytest.mark.slow

LSTM = lstm_job("perf-lstm", "train.epochs=3", "mlflow.enabled=false", "checkpoint.enabled=false")


@pytest.mark.parametrize("mode", ["fp16", "bf16"])
def test_compressed_sync_trains_and_keeps_the_replicas_in_step(ray_address, tmp_path, mode):
    from tests.models import stateful_lstm

    # bf16 also with Dropout: each rank draws its own masks (its own seed state), the weights stay in step
    random = ["model.kwargs.dropout=0.1"] if mode == "bf16" else []
    result = rayparallel.train(
        LSTM, overrides=[f"train.gradient_compression={mode}", *random], output_dir=tmp_path / mode, verbose=False
    )
    losses = [epoch["loss"] for epoch in result.history]
    digests = {w["final_weights_sha256"] for w in result.workers}
    print(f"{mode} sync: loss per epoch {[round(x, 4) for x in losses]}")
    assert losses[-1] < 0.8 * losses[0]
    assert len(result.workers) == 2 and len(digests) == 1  # both replicas hold the very same weights

    startup = result.startup
    assert list(startup) == [p for p in PHASES if p != "workers_reused"]  # a group of its own: every phase, one clock
    chain = [startup[p] for p in PHASES[PHASES.index("workers_started") :]]  # each waits for the one before
    assert all(a <= b for a, b in zip(chain, chain[1:], strict=False))
    # overlapping: the checks run beside the local Ray's start (either may end first), the recorder beside
    # the worker group (it is up before the workers' first calls on it, which come before their first trace)
    assert max(startup["spec_checked"], startup["ray_ready"]) <= startup["workers_started"]
    assert startup["ray_ready"] <= startup["recorder_ready"] <= startup["first_step_traced"]
    assert 0 < startup["spec_checked"] and result.time_to_first_step_s == startup["first_step_done"]
    assert startup["first_step_done"] < result.seconds

    if mode == "fp16":  # not exact, but close to Keras `fit` (what the float32 sync trains) after 3 epochs
        exact, _ = keras_fit_streams(LSTM)
        drift = max_relative_error(final_weights(result.final_weights, stateful_lstm), exact.get_weights())
        print(f"fp16 sync vs Keras fit after 3 epochs: max relative weight difference {drift:.2e}")
        assert drift < 0.05
