"""Search spaces as people write them (`loguniform(1e-4, 1e-1)`) and the trials they expand to.

The trials are drawn here, from the sweep's seed, before Ray Tune starts: the list is
written to `tune.json`, so a resumed sweep runs exactly the trials that did not finish.
Semantics follow Ray Tune's: `grid` values are all tried, every other space is sampled,
and the sample count repeats the whole grid (`num_samples`); `randint`'s upper bound is
excluded, as in `tune.randint`.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import re
from dataclasses import dataclass
from typing import Any

import yaml

from ..errors import SpecError
from ..spec import load_yaml

FUNCTIONS = ("choice", "grid", "uniform", "loguniform", "randint")
_CALL = re.compile(r"\s*([A-Za-z_]\w*)\s*\((.*)\)\s*", re.DOTALL)


@dataclass(frozen=True)
class Space:
    """One key's space: `function` is one of FUNCTIONS, `args` its YAML-typed arguments."""

    function: str
    args: tuple
    text: str  # as the user wrote it, for params and tables

    def sample(self, rng: random.Random) -> Any:
        if self.function == "choice":
            return rng.choice(self.args)
        lo, hi = self.args
        if self.function == "uniform":
            return rng.uniform(lo, hi)
        if self.function == "loguniform":
            return math.exp(rng.uniform(math.log(lo), math.log(hi)))
        return rng.randrange(lo, hi)  # randint


@dataclass(frozen=True)
class Trial:
    id: str  # "trial-003": its folder's name in the sweep's output dir
    params: dict[str, Any]  # dotted spec key -> value

    @property
    def overrides(self) -> list[str]:
        """As `--set` takes them: `train.optimizer.config.learning_rate=0.003`."""
        return [f"{key}={_as_text(value)}" for key, value in self.params.items()]


def parse_space(key: str, text: str) -> Space:
    """`choice(16, 32)` -> Space("choice", (16, 32)); one-line errors for anything else.

    >>> parse_space("model.kwargs.units", "choice(16, 32)").args
    (16, 32)
    >>> parse_space("train.optimizer.config.learning_rate", "loguniform(1e-4, 1e-1)").args
    (0.0001, 0.1)
    """
    label = f"--param {key}"
    expected = f"FUNCTION(ARGS) with FUNCTION one of {', '.join(FUNCTIONS)}"
    match = _CALL.fullmatch(str(text))
    if not match:
        raise SpecError(f"{label}: expected {expected}, received {text!r}")
    function, inside = match.groups()
    if function not in FUNCTIONS:
        raise SpecError(f"{label}: expected {expected}, received {function!r}")
    try:
        args = tuple(load_yaml(f"[{inside}]"))
    except yaml.YAMLError:
        raise SpecError(
            f"{label}: expected comma-separated YAML values inside {function}(...), received {text!r}"
        ) from None
    if function in ("choice", "grid"):
        if not args:
            raise SpecError(f"{label}: expected at least one value in {function}(...), received {text!r}")
        return Space(function, args, text)
    bounds = "two integers lo < hi" if function == "randint" else "two numbers lo < hi"
    if function == "loguniform":
        bounds += " with lo > 0"
    numbers = len(args) == 2 and all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args)
    valid = numbers and args[0] < args[1]
    if valid and function == "randint":
        valid = all(isinstance(a, int) for a in args)
    if valid and function == "loguniform":
        valid = args[0] > 0
    if not valid:
        raise SpecError(f"{label}: expected {function}(lo, hi) with {bounds}, received {text!r}")
    return Space(function, args, text)


def plan_trials(spaces: dict[str, Space], samples: int | None, seed: int) -> list[Trial]:
    """Every grid point, `samples` times (default 1), with the other spaces drawn from `seed`.

    >>> spaces = {"a": parse_space("a", "grid(1, 2)"), "b": parse_space("b", "choice(x)")}
    >>> [t.params for t in plan_trials(spaces, 2, 0)]
    [{'a': 1, 'b': 'x'}, {'a': 2, 'b': 'x'}, {'a': 1, 'b': 'x'}, {'a': 2, 'b': 'x'}]
    """
    if not spaces:
        raise SpecError("tune.params: expected at least one KEY=SPACE (--param or the tune: section), received none")
    if samples is not None and (not isinstance(samples, int) or isinstance(samples, bool) or samples < 1):
        raise SpecError(f"--samples: expected a positive integer, received {samples!r}")
    grid = {key: s.args for key, s in spaces.items() if s.function == "grid"}
    drawn = [key for key, s in spaces.items() if s.function != "grid"]
    if grid and not drawn and samples not in (None, 1):
        points = math.prod(len(v) for v in grid.values())
        raise SpecError(
            f"--samples: expected 1 for a sweep of grid spaces only ({points} trials, each grid point once), "
            f"received {samples}: every trial would run {samples} times with the same settings"
        )
    rng = random.Random(seed)
    trials = []
    for _ in range(samples or 1):
        for values in itertools.product(*grid.values()):
            params = dict(zip(grid, values, strict=True))
            params.update({key: spaces[key].sample(rng) for key in drawn})
            trials.append(Trial(f"trial-{len(trials):03d}", {key: params[key] for key in spaces}))
    return trials


def _as_text(value: Any) -> str:
    """A value as `--set` reads it back: strings bare where YAML keeps them strings."""
    text = value if isinstance(value, str) else json.dumps(value)
    return text if load_yaml(text) == value else json.dumps(value)
