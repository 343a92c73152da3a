"""What Keras' own losses with global divisors cost: `python -m benchmarks.masked_loss [--quick] [--json PATH]`.

(a) Every step now calls the Keras loss itself and divides by a global divisor: the VGG
benchmark job's step time on 1 worker against plain Keras `fit` (`overhead_vs_keras_fit`,
target <= 1.05, as `benchmarks.run` measures it). (b) A padded sequence model adds one scalar
all-reduce per step (the unmasked count summed over the workers): the masked tagger on 2
workers with its mask against the same net without one, beside the same ratio for Keras `fit`
in one process, whose masked step has no collective (`mask_cost_2w` / `mask_cost_keras_fit`;
their ratio is what the collective adds). Rounds alternate the variants; each figure is the
median samples/s of the epochs after the first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.figures import report

REPO = Path(__file__).resolve().parents[1]
BATCH = 64


def rayparallel_tagger(mask: bool, rows: int, epochs: int, out: Path) -> float:
    import rayparallel

    job = {
        "name": f"tagger-{'mask' if mask else 'nomask'}",
        "model": {"builder": "benchmarks.models:masked_tagger", "kwargs": {"mask": mask}},
        "data": {"loader": "benchmarks.models:padded_tags", "kwargs": {"rows": rows}, "layout": "streams"},
        "train": {"global_batch_size": BATCH, "epochs": epochs},
        "scaling": {"num_workers": 2},
        "checkpoint": {"enabled": False},
        "mlflow": {"enabled": False},
    }
    result = rayparallel.train(job, output_dir=out / f"run-{time.time_ns()}", verbose=False, resume=False)
    return statistics.median(h["samples_per_s"] for h in result.history[1:])


def keras_fit_tagger(mask: bool, rows: int, epochs: int) -> float:
    """Samples/s of plain `fit` on the same model in a fresh process (two threads, as the two workers hold)."""
    code = f"""
import json, os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
sys.path.insert(0, {str(REPO)!r})
import keras
from benchmarks.models import masked_tagger, padded_tags
data = padded_tags(rows={rows})
model = masked_tagger({BATCH}, mask={mask})
times = []
class Clock(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None): self.t = time.perf_counter()
    def on_epoch_end(self, epoch, logs=None): times.append(time.perf_counter() - self.t)
model.fit(data["x_train"], data["y_train"], batch_size={BATCH}, epochs={epochs}, shuffle=False, verbose=0, callbacks=[Clock()])
print("RESULT", json.dumps([{rows} / t for t in times[1:]]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=900)
    line = [text for text in out.stdout.splitlines() if text.startswith("RESULT ")]
    if not line:
        raise RuntimeError(f"keras fit benchmark failed: {out.stderr[-2000:]}")
    return statistics.median(json.loads(line[0][7:]))


def main() -> None:
    from benchmarks import baselines
    from benchmarks.run import rayparallel_throughput

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round of short epochs")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 3, 1 with --quick)")
    parser.add_argument("--json", default=None, help="where to write the figures")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    rows, epochs, repeat = (2048, 3, 2) if args.quick else (4096, 4, 4)
    raw: dict[str, list[float]] = {k: [] for k in ("fit", "rp_1w", "rp_mask", "rp_nomask", "fit_mask", "fit_nomask")}
    with tempfile.TemporaryDirectory(prefix="rayparallel-bench-") as tmp:
        out = Path(tmp)
        for round_ in range(rounds):
            raw["fit"].append(baselines.keras_fit(1, epochs, BATCH, repeat))
            raw["rp_1w"].append(rayparallel_throughput(1, epochs, repeat, out))
            for mask in (True, False):
                key = "mask" if mask else "nomask"
                raw[f"rp_{key}"].append(rayparallel_tagger(mask, rows, epochs, out))
                raw[f"fit_{key}"].append(keras_fit_tagger(mask, rows, epochs))
            print(f"round {round_ + 1}/{rounds}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in raw.items()), flush=True)
    per_round = {
        "overhead_vs_keras_fit": [f / r for f, r in zip(raw["fit"], raw["rp_1w"], strict=True)],
        "mask_cost_2w": [n / m for m, n in zip(raw["rp_mask"], raw["rp_nomask"], strict=True)],
        "mask_cost_keras_fit": [n / m for m, n in zip(raw["fit_mask"], raw["fit_nomask"], strict=True)],
    }
    figures = {name: statistics.median(values) for name, values in per_round.items()}
    figures.update({f"{name}_rounds": values for name, values in per_round.items()}, samples_per_s=raw)
    line = (
        f"(a) step time vs Keras fit, 1 worker: {figures['overhead_vs_keras_fit']:.3f} (target <= 1.05); "
        f"(b) masked/unmasked step time: 2 workers {figures['mask_cost_2w']:.3f}, "
        f"Keras fit {figures['mask_cost_keras_fit']:.3f}"
    )
    report(figures, line, args.json)


if __name__ == "__main__":
    main()
