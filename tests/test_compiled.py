"""A builder's compile as the job's settings (pure logic on small Keras models, no Ray)."""

from __future__ import annotations

import pytest

from rayparallel.errors import SpecError
from rayparallel.spec.schema import TrainSpec
from rayparallel.worker import compile_settings as compiled


def test_a_compiled_builder_gives_its_live_settings_and_a_plain_one_the_defaults():
    from tests.models import compiled_regressor, dense_regressor

    given = TrainSpec(global_batch_size=8)
    model = compiled_regressor(8)
    used = compiled.resolve(given, model)
    assert used.loss is model.loss and used.optimizer is model.optimizer  # the objects, Huber's delta kept
    assert [m.name for m in used.metrics] == ["mae"]
    shown = compiled.described(given, used)
    assert shown["train.loss"] == "Huber(reduction='sum_over_batch_size', delta=0.5)"
    assert shown["train.optimizer"].startswith("SGD(") and "momentum=0.5" in shown["train.optimizer"]
    plain = compiled.resolve(given, dense_regressor(8))
    assert (plain.optimizer, plain.loss) == ("adam", "mean_squared_error")
    assert compiled.described(given, plain) == {"train.optimizer": "adam", "train.loss": "mean_squared_error"}


def test_settings_given_twice_must_agree():
    from tests.models import compiled_regressor

    model = compiled_regressor(8)
    same = TrainSpec(global_batch_size=8, loss={"class_name": "Huber", "config": {"delta": 0.5}}, metrics=["mae"])
    assert compiled.resolve(same, model).loss is model.loss
    with pytest.raises(SpecError, match=r"^train.loss: expected the builder's compile\(loss=Huber\) or nothing"):
        compiled.resolve(TrainSpec(global_batch_size=8, loss={"class_name": "Huber", "config": {"delta": 2.0}}), model)
    with pytest.raises(SpecError, match=r"^train.optimizer: expected the builder's compile\(optimizer=SGD\)"):
        compiled.resolve(TrainSpec(global_batch_size=8, optimizer="adam"), model)
