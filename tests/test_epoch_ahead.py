"""Ray Data's next epoch opened before this one ends (pure logic: epochs of numbered batches)."""

from __future__ import annotations

import time

import pytest

from rayparallel.data.epoch_ahead import EpochAhead


class Epochs:
    """`open_epoch` for EpochAhead: epoch e's batches are (e, 1), (e, 2), ...; every open and every
    batch taken is logged, the first batch of epoch 1 after `start_up_s` (a plan's start-up)."""

    def __init__(self, steps: int, start_up_s: float = 0.0):
        self.steps, self.start_up_s, self.log = steps, start_up_s, []

    def __call__(self, epoch: int):
        self.log.append(("open", epoch))
        return self._batches(epoch)

    def _batches(self, epoch: int):
        if epoch == 1:
            time.sleep(self.start_up_s)
        for step in range(1, self.steps + 1):
            yield epoch, step


def train(ahead: EpochAhead, epochs: Epochs, count: int, step_s: float = 0.0) -> list:
    seen = []
    for epoch in range(1, count + 1):
        for batch in ahead.epoch(epoch):
            epochs.log.append(("step", batch))
            seen.append(batch)
            time.sleep(step_s)
    return seen


def test_the_next_epoch_opens_while_this_one_runs_and_batches_stay_in_order():
    epochs = Epochs(steps=6, start_up_s=0.05)  # steps take no time: the next epoch opens after step 1
    seen = train(EpochAhead(epochs, epochs=3, steps=6), epochs, 3)
    assert seen == [(e, s) for e in (1, 2, 3) for s in range(1, 7)]
    opens = [epochs.log.index(("open", e)) for e in (1, 2, 3)]
    assert opens[1] < epochs.log.index(("step", (1, 6))) and opens[2] < epochs.log.index(("step", (2, 6)))
    assert ("open", 4) not in epochs.log  # never past the last epoch


@pytest.mark.parametrize("start_up_s", [0.0, 0.01])
def test_with_slow_steps_the_next_epoch_opens_at_the_last_step(start_up_s):
    epochs = Epochs(steps=4, start_up_s=start_up_s)
    train(EpochAhead(epochs, epochs=2, steps=4), epochs, 2, step_s=0.05)  # 1 step left x 0.05 s > 2 x 0.01 s
    assert epochs.log.index(("open", 2)) == epochs.log.index(("step", (1, 3))) + 1  # before step 4, after 3


def test_an_error_opening_the_next_epoch_reaches_the_loop_at_that_epoch():
    def open_epoch(epoch: int):
        if epoch == 2:
            raise_in_generator = ValueError("the dataset changed")

            def broken():
                raise raise_in_generator
                yield

            return broken()
        return iter([(1, 1), (1, 2)])

    ahead = EpochAhead(open_epoch, epochs=2, steps=2)
    assert list(ahead.epoch(1)) == [(1, 1), (1, 2)]
    with pytest.raises(ValueError, match="the dataset changed"):
        list(ahead.epoch(2))
