"""When the workers pause together for progress (pure logic: every rank must decide alike)."""

from __future__ import annotations

from rayparallel.worker.cadence import ProgressCadence


def pauses(cadence: ProgressCadence) -> list[int]:
    cadence.start_epoch()
    return [step for step in range(1, cadence.steps_per_epoch + 1) if cadence.due(step)]


def test_about_ten_pauses_per_epoch_never_at_its_last_step():
    cadence = ProgressCadence(steps_per_epoch=100)
    assert pauses(cadence) == [10, 20, 30, 40, 50, 60, 70, 80, 90]
    assert pauses(ProgressCadence(steps_per_epoch=5)) == [1, 2, 3, 4]


def test_short_steps_space_pauses_at_least_min_seconds_apart_on_every_rank_alike():
    cadence = ProgressCadence(steps_per_epoch=1000, min_seconds=2.0)
    cadence.start_epoch()
    assert [s for s in range(1, 101) if cadence.due(s)] == [100]
    cadence.observe(seconds=1.0, steps=100)  # rank 0's figure, reduced: the same on every rank
    assert [s for s in range(101, 1001) if cadence.due(s)] == [300, 500, 700, 900]
    assert pauses(cadence) == [200, 400, 600, 800]  # the next epoch starts at the learned stride


def test_fixed_every_n_steps_ignores_timing():
    cadence = ProgressCadence(steps_per_epoch=20, every_n_steps=7)
    cadence.observe(seconds=100.0, steps=1)
    assert pauses(cadence) == [7, 14]
