"""What global BatchNormalization costs: `python -m benchmarks.batch_norm [--quick] [--json PATH]`.

Trains the U-Net with BatchNormalization after each of its 10 convolutions
(`jobs/unet_segmentation_bn.yaml`) on 2 workers with `train.batch_norm: global` (three
all-reduces per layer and step, inside the step) and `local` (none; the moving statistics
averaged once an epoch), in alternating rounds, and reports the median step time of each
(from the samples/s of the epochs after the first) and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from benchmarks.figures import report
from benchmarks.resume_points import throughput

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round of short epochs")
    parser.add_argument("--json", default=None, help="where to write the figures")
    args = parser.parse_args()
    rounds, samples = (1, 128) if args.quick else (3, 512)
    job = str(REPO / "jobs" / "unet_segmentation_bn.yaml")
    overrides = ["train.epochs=3", f"data.kwargs.samples={samples}", "mlflow.enabled=false", "checkpoint.enabled=false"]
    step_ms: dict[str, list[float]] = {"global": [], "local": []}
    with tempfile.TemporaryDirectory(prefix="rayparallel-bench-") as tmp:
        for round_ in range(rounds):
            for mode, times in step_ms.items():
                samples_per_s = throughput(job, [*overrides, f"train.batch_norm={mode}"], Path(tmp))
                times.append(16 / samples_per_s * 1000)  # the job's global batch
            print(
                f"round {round_ + 1}: step {step_ms['global'][-1]:.1f} ms global, {step_ms['local'][-1]:.1f} ms local"
            )
    figures = {
        "batch_norm_layers": 10,
        "step_ms_global": statistics.median(step_ms["global"]),
        "step_ms_local": statistics.median(step_ms["local"]),
        "rounds": step_ms,
    }
    figures["global_vs_local_step_time"] = figures["step_ms_global"] / figures["step_ms_local"]
    report(
        figures,
        f"BatchNormalization on the global batch vs per worker, 2 workers: step {figures['step_ms_global']:.1f} ms vs "
        f"{figures['step_ms_local']:.1f} ms ({figures['global_vs_local_step_time']:.2f}x)",
        args.json,
    )


if __name__ == "__main__":
    main()
