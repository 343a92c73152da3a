"""ModelCheckpoint rules: names, best-only, keep, template checks (pure logic)."""

from __future__ import annotations

import pytest

from rayparallel.checkpoint.policy import Retention, SaveDecision, check_against_metrics, files_kept, resolve_mode
from rayparallel.errors import SpecError
from rayparallel.spec import CheckpointSpec


def saved(retention: Retention, epoch: int, **logs) -> list[str]:
    point = SaveDecision(retention.spec).to_save(epoch, epoch * 10, 10, logs)
    return [d.file for d in retention.record(point)]


def test_filename_uses_keras_template_fields():
    decision = SaveDecision(CheckpointSpec(filepath="unet-{epoch:02d}-{val_loss:.4f}-{val_iou:.4f}.weights.h5"))
    point = decision.to_save(3, 30, 10, {"val_loss": 0.123456, "val_iou": 0.5})
    assert point.file == "unet-03-0.1235-0.5000.weights.h5"
    assert (point.epoch, point.step, point.logs) == (3, 30, {"val_loss": 0.123456, "val_iou": 0.5})


def test_auto_mode_follows_keras():
    assert resolve_mode("val_loss", "auto") == "min"
    assert resolve_mode("val_accuracy", "auto") == "max"
    assert resolve_mode("val_iou", "auto") == "max"
    assert resolve_mode("val_accuracy", "min") == "min"


def test_save_best_only_saves_only_improvements():
    decision = SaveDecision(CheckpointSpec(save_best_only=True, monitor="val_loss"))
    decisions = []
    for epoch, value in enumerate([0.5, 0.6, 0.4, 0.4, float("nan"), 0.3], start=1):
        decisions.append(decision.to_save(epoch, epoch, 1, {"val_loss": value}) is not None)
    assert decisions == [True, False, True, False, False, True]
    assert decision.best == 0.3
    assert SaveDecision(CheckpointSpec(enabled=False)).to_save(1, 1, 1, {"val_loss": 0.1}) is None


def test_keep_best_k_plus_latest():
    retention = Retention(CheckpointSpec(filepath="e{epoch}.weights.h5", monitor="val_accuracy", keep=2))
    assert saved(retention, 1, val_accuracy=0.5) == []
    assert saved(retention, 2, val_accuracy=0.9) == []
    assert saved(retention, 3, val_accuracy=0.7) == ["e1.weights.h5"]
    assert saved(retention, 4, val_accuracy=0.6) == []  # latest kept although not in the best 2
    assert sorted(s.file for s in retention.saved) == ["e2.weights.h5", "e3.weights.h5", "e4.weights.h5"]
    assert saved(retention, 5, val_accuracy=0.95) == ["e3.weights.h5", "e4.weights.h5"]
    assert sorted(s.file for s in retention.saved) == ["e2.weights.h5", "e5.weights.h5"]
    assert retention.best_entry().file == "e5.weights.h5" and retention.best_value() == 0.95


def test_template_naming_unknown_metric_is_rejected():
    keys = ["loss", "accuracy", "val_loss", "val_accuracy"]
    spec = CheckpointSpec(filepath="m-{epoch:02d}-{val_iou:.3f}.weights.h5")
    with pytest.raises(
        SpecError,
        match=r"checkpoint.filepath: expected fields among \[.*'val_loss'.*\] \(figures at epoch end\), received \{val_iou\}",
    ):
        check_against_metrics(spec, keys, ["loss"])
    step_spec = CheckpointSpec(filepath="m-{step}-{val_loss}.weights.h5", save_freq=5)
    with pytest.raises(SpecError, match=r"\(figures every 5 steps\), received \{val_loss\}"):
        check_against_metrics(step_spec, keys, ["loss"])
    with pytest.raises(SpecError, match="checkpoint.monitor: expected one of"):
        check_against_metrics(CheckpointSpec(monitor="val_iou", save_best_only=True), keys, ["loss"])
    check_against_metrics(CheckpointSpec(filepath="m-{epoch}-{val_accuracy:.2f}.weights.h5"), keys, ["loss"])


def test_files_kept_counts_saves_the_keep_rule_and_the_final_weights():
    assert files_kept(CheckpointSpec(), epochs=15, steps_per_epoch=40) == 16  # one a epoch, and final
    assert files_kept(CheckpointSpec(keep=2), epochs=15, steps_per_epoch=40) == 4  # best 2 + latest, and final
    assert files_kept(CheckpointSpec(save_freq=100), epochs=15, steps_per_epoch=40) == 7  # 600 steps: 6 saves
    assert files_kept(CheckpointSpec(filepath="best.weights.h5"), epochs=15, steps_per_epoch=40) == 2
