"""Mixed precision with loss scaling, run here on CPUs (real Ray, real TF).

float16 is slower on a CPU, but the logic is the same: every worker skips the same
overflowing steps (if they did not, their gradient all-reduces would no longer pair up and
the run would time out). The XLA step is checked in test_equivalence.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import rayparallel
from tests.test_equivalence import CNN

from .helpers import final_weights

pytestmark = pytest.mark.slow


def test_mixed_float16_skips_overflowing_steps_on_every_worker_and_trains(ray_address, tmp_path):
    from tests.models import small_cnn

    initial = 2.0**30  # overflows float16 gradients: the first steps must be skipped, everywhere
    result = rayparallel.train(
        CNN,
        overrides=[
            "scaling.num_workers=2",
            "run.collective_timeout_s=120",
            "train.epochs=3",
            "train.dtype_policy=mixed_float16",
            f"train.initial_loss_scale={initial}",
        ],
        output_dir=tmp_path / "fp16",
        verbose=False,
    )
    scales = [epoch["loss_scale"] for epoch in result.history]
    print(f"mixed_float16: loss scale per epoch {scales}, loss {[round(e['loss'], 4) for e in result.history]}")
    assert 1.0 <= scales[0] < initial  # halved on overflow
    assert all(math.isfinite(epoch["loss"]) for epoch in result.history)
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    weights = final_weights(result.final_weights, small_cnn)  # saved as float32, loadable into a float32 model
    assert all(w.dtype == np.float32 and np.isfinite(w).all() for w in weights)
