"""The sweep's progress on the console: one line per trial start, epoch and end.

A Ray Tune callback, so it runs in the sweep's driver with Tune's view of every trial;
Tune's own table is turned off (`verbose=0`) in its favour.
"""

from __future__ import annotations

from collections.abc import Callable

from ray import tune

from ..cluster.progress import format_logs
from .space import Trial


class SweepConsole(tune.Callback):
    def __init__(self, trials: dict[str, Trial], keys: list[str], say: Callable[[str], None]):
        self._trials, self._keys, self._say = trials, keys, say

    def on_trial_start(self, iteration, trials, trial, **info):
        self._say(f"{self._name(trial)}: started, {' '.join(self._trials[trial.config['trial']].overrides)}")

    def on_trial_result(self, iteration, trials, trial, result, **info):
        logs = {k: result[k] for k in self._keys if k in result}
        self._say(f"{self._name(trial)}: epoch {result['epoch']}: {format_logs(logs)}")

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._say(f"{self._name(trial)}: ended")

    def on_trial_error(self, iteration, trials, trial, **info):
        self._say(f"{self._name(trial)}: failed")

    @staticmethod
    def _name(trial) -> str:
        return trial.config["trial"]
