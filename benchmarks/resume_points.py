"""What resume points inside epochs cost: `python -m benchmarks.resume_points [--quick] [--json PATH]`.

Trains the same job on 2 workers with `run.resume_every_n_steps: N` and without, in
alternating rounds, and reports the median training throughput (samples/s of the epochs
after the first) of each and their ratio (target >= 0.95 at N = 50). Each point snapshots
the weights and optimizer (about a millisecond), gathers the running epoch across workers
(one small collective) and hands the arrays to the recorder, which writes them in its own
process while training goes on.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.figures import report

REPO = Path(__file__).resolve().parents[1]


def throughput(job: str, overrides: list[str], out: Path) -> float:
    """Median samples/s of the epochs after the first (also used by other benchmarks)."""
    import rayparallel

    result = rayparallel.train(
        job,
        overrides=overrides,
        output_dir=out / f"run-{time.time_ns()}",
        verbose=False,
        resume=False,
    )
    return statistics.median(h["samples_per_s"] for h in result.history[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round of short epochs")
    parser.add_argument("--every", type=int, default=50, help="steps between resume points (default 50)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 3, 1 with --quick)")
    parser.add_argument("--json", default=None, help="where to write the figures")
    args = parser.parse_args()
    rounds, repeat = (1, 2) if args.quick else (3, 6)
    rounds = args.rounds or rounds
    job = str(REPO / "jobs" / "vgg_classifier.yaml")
    overrides = [
        "scaling.num_workers=2",
        "train.epochs=3",
        f"data.kwargs.repeat={repeat}",
        "train.global_batch_size=64",
        "mlflow.enabled=false",
        "checkpoint.enabled=false",
        "data.kwargs.seed=0",
    ]
    with tempfile.TemporaryDirectory(prefix="rayparallel-bench-") as tmp:
        out = Path(tmp)
        with_points, without, ratios = [], [], []
        for round_ in range(rounds):
            base = throughput(job, overrides, out)
            points = throughput(job, [*overrides, f"run.resume_every_n_steps={args.every}"], out)
            without.append(base)
            with_points.append(points)
            ratios.append(points / base)
            print(
                f"round {round_ + 1}: {points:.1f} samples/s with points every {args.every} steps, {base:.1f} without"
            )
    figures = {
        "every_n_steps": args.every,
        "samples_per_s_with_points": statistics.median(with_points),
        "samples_per_s_without": statistics.median(without),
        "resume_points_vs_none_throughput": statistics.median(ratios),
        "ratios": ratios,
    }
    report(
        figures,
        f"resume points every {args.every} steps vs none: throughput ratio {figures['resume_points_vs_none_throughput']:.3f} "
        f"(target >= 0.95; rounds: {', '.join(f'{r:.3f}' for r in ratios)})",
        args.json,
    )


if __name__ == "__main__":
    main()
