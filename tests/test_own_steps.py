"""A model's own `train_step`/`test_step`/`compute_loss` and a builder's `compile`, against the
oracle: plain Keras `fit` in this process, same data, seed and settings, on 2 workers."""

from __future__ import annotations

import pytest

from .helpers import final_weights, job, keras_fit, max_relative_error, train_shared

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "builder, train, compile_args",
    [
        # its own loss (MAE) and trackers; the job's SGD reaches it through the compile we make
        ("guide_train_step", {"optimizer": {"class_name": "SGD", "config": {"learning_rate": 0.05}}}, "sgd"),
        # compiled by its builder (SGD with momentum), its own compute_loss with the layers' L2 losses
        ("guide_compute_loss", {}, None),
        # a plain model compiled by its builder: Huber(delta=0.5), SGD with momentum, MAE from compile (our
        # own step)
        ("compiled_regressor", {}, None),
    ],
)
def test_own_steps_and_compiled_builders_train_fits_model_on_2_workers(
    shared_workers, tmp_path, builder, train, compile_args
):
    import keras

    from tests import models

    build = getattr(models, builder)
    spec = job(builder, builder, "linear_rows", {}, epochs=2, **train)
    args = {"optimizer": keras.optimizers.SGD(0.05)} if compile_args else None
    model, history = keras_fit(build, models.linear_rows(), args, 2)
    result = train_shared(shared_workers, spec, ["scaling.num_workers=2"], output_dir=tmp_path / "out", verbose=False)
    error = max_relative_error(final_weights(result.final_weights, build), model.get_weights())
    print(f"{builder}, 2 workers vs Keras fit: max relative weight error {error:.2e}")
    assert error < 1e-5
    assert len({w["final_weights_sha256"] for w in result.workers}) == 1
    assert set(result.history[0]) >= set(history)
    for key, values in history.items():
        assert [epoch[key] for epoch in result.history] == pytest.approx(values, rel=1e-4, abs=1e-6), key
