"""What summing the position embedding's sparse gradient costs: `python -m benchmarks.sparse_slices [--rounds N]
[--before REV] [--json PATH]`.

The keras-io Transformer (`tests.conformance_models:position_transformer`, `global_clipnorm`) on 2 workers,
with the code of `--before` (a commit whose all-reduce gathers every sparse gradient) and with this tree's, or
`--after`'s (`worker/sync.py`, `sum_shared_slices`: the position embedding's rows summed in the one dense
all-reduce of the other gradients).
Rounds alternate the two; each run is a fresh driver process whose local Ray starts its workers from that
process's `rayparallel` (first on `PYTHONPATH`, checked), the job's modules from this folder.
Each figure is the median samples/s of a run's epochs after the first; `after_vs_before_step_time` is the
median of the rounds' step-time ratios (target <= 1.05).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from benchmarks.figures import report

REPO = Path(__file__).resolve().parents[1]
RUN = """
import json, statistics, sys
import rayparallel
job = {
    "name": "sparse-slices",
    "model": {"builder": "tests.conformance_models:position_transformer", "kwargs": {"tokens": 32, "vocab": 500}},
    "data": {"loader": "tests.conformance_models:token_classes",
             "kwargs": {"rows": ROWS, "val_rows": 64, "tokens": 32, "vocab": 500}, "layout": "shuffle"},
    "train": {"global_batch_size": 64, "epochs": EPOCHS},
    "scaling": {"num_workers": 2},
    "checkpoint": {"enabled": False},
    "mlflow": {"enabled": False},
}
result = rayparallel.train(job, output_dir=sys.argv[1], verbose=False, resume=False)
print("RESULT", json.dumps([rayparallel.__path__[0], [epoch["samples_per_s"] for epoch in result.history[1:]]]))
"""


def code_of(revision: str, folder: Path) -> Path:
    """`rayparallel/` as it was at `revision`, alone in `folder` (nothing else of the repository shadows)."""
    archive = subprocess.run(["git", "archive", revision, "rayparallel"], cwd=REPO, capture_output=True, check=True)
    with tarfile.open(fileobj=__import__("io").BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")
    return folder


def samples_per_s(code: Path | None, rows: int, epochs: int, out: Path) -> float:
    """One run's median samples/s. Its driver runs in `out` (`python -c` puts its folder first on sys.path):
    `rayparallel` from `code` (else this tree), `tests` from this tree, in it and in the workers it starts."""
    out.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(code or REPO), str(REPO)]))
    env.pop("RAY_ADDRESS", None)  # a local Ray of its own, started from this process's rayparallel
    script = RUN.replace("ROWS", str(rows)).replace("EPOCHS", str(epochs))
    done = subprocess.run(
        [sys.executable, "-c", script, str(out / "run")], capture_output=True, text=True, cwd=out, env=env, timeout=1200
    )
    line = [text for text in done.stdout.splitlines() if text.startswith("RESULT ")]
    if not line:
        raise RuntimeError(f"run failed: {done.stderr[-2000:]}")
    used, figures = json.loads(line[0][7:])
    if Path(used).parent != Path(code or REPO):
        raise RuntimeError(f"the run imported rayparallel from {used}, not from {code or REPO}")
    return statistics.median(figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="1fe022d", help="the commit to compare with (default: before the change)")
    parser.add_argument("--after", default=None, help="a commit to measure instead of this tree's code")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--rows", type=int, default=4096, help="training rows (default 4096: 64 steps an epoch)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--json", default=None, help="where to write the figures")
    args = parser.parse_args()
    raw: dict[str, list[float]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="rayparallel-bench-") as tmp:
        before = code_of(args.before, Path(tmp) / "before")
        after = code_of(args.after, Path(tmp) / "after") if args.after else None
        for round_ in range(args.rounds):
            for name, code in (("before", before), ("after", after)):
                raw[name].append(samples_per_s(code, args.rows, args.epochs, Path(tmp) / f"{name}-{round_}"))
            print(f"round {round_ + 1}/{args.rounds}: before {raw['before'][-1]:.0f}, after {raw['after'][-1]:.0f}")
    ratios = [b / a for b, a in zip(raw["before"], raw["after"], strict=True)]  # step time after / before
    figures = {"after_vs_before_step_time": statistics.median(ratios), "rounds": ratios, "samples_per_s": raw}
    line = (
        f"Transformer with a position embedding, 2 workers: step time after / before {figures['after_vs_before_step_time']:.3f} "
        f"(rounds {', '.join(f'{r:.3f}' for r in ratios)}; samples/s before {statistics.median(raw['before']):.0f}, "
        f"after {statistics.median(raw['after']):.0f}; target <= 1.05)"
    )
    report(figures, line, args.json)


if __name__ == "__main__":
    main()
