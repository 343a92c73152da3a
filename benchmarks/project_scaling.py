"""Past this machine, on paper: projected throughput and scaling efficiency for 2-64 workers.

`python -m benchmarks.project_scaling [--results benchmarks/results.json] [--json PATH]`

The step of a worker is its compute plus the gradient all-reduce, which rayparallel runs
after the backward pass (no overlap). The all-reduce is NCCL's ring:
`2(N-1) * latency + 2(N-1)/N * bytes / bandwidth`. Weak scaling: each worker keeps its batch,
so N workers process N times the samples of one per step when the sync is free.

Measured here (from a `benchmarks.run` JSON): this 2-core machine's compute per sample and
its CPU ring's latency and bandwidth, fitted to the gradient sync against bytes; they are
printed to show the fit, and they explain this machine's figures, not a GPU's. The GPU
projections take the stated assumptions below (compute per sample and interconnects), with
fp16 compression (half the bytes) and gradient accumulation (one sync per k batches) as
options, and are checked against a published figure: Horovod's ~90% efficiency at 128
GPUs for ResNet-101 over 25 GbE RoCE, which overlaps the all-reduce with backprop.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

WORKERS = (2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Interconnect:
    name: str
    bandwidth: float  # bytes/s one ring link moves (NCCL "bus bandwidth")
    latency: float  # seconds per ring step


@dataclass(frozen=True)
class Model:
    name: str
    parameters: float
    seconds_per_sample: float  # forward + backward on one GPU (assumption, stated)
    batch: int  # per worker


INTERCONNECTS = (
    Interconnect("NVLink-class (NVSwitch fabric)", 150e9, 5e-6),
    Interconnect("100 GbE (RoCE)", 11e9, 15e-6),
    Interconnect("25 GbE (RoCE)", 2.8e9, 25e-6),
)
MODELS = (  # per-GPU compute: A100-class, mixed precision
    Model("VGG digits job (0.35M)", 0.35e6, 20e-6, 64),  # tiny 16x16 convolutions: launch-bound
    Model("ResNet-50-sized (25.6M)", 25.6e6, 1 / 2500, 256),  # ~2,500 img/s per A100 (published training figures)
    Model("checkpoint model (50.3M dense)", 50.3e6, 6e-6, 256),  # 6 x 50M FLOP per sample at ~50 TFLOP/s
)
# Horovod paper (Sergeev & Del Balso, 2018): ResNet-101 on 128 Pascal GPUs, 25 GbE RoCE, ~90% efficiency.
HOROVOD = (Model("ResNet-101 on P100 (Horovod)", 44.5e6, 1 / 110, 64), INTERCONNECTS[2], 128, 0.90)


def ring_allreduce_s(workers: int, nbytes: float, link: Interconnect) -> float:
    return 2 * (workers - 1) * link.latency + 2 * (workers - 1) / workers * nbytes / link.bandwidth


def efficiency(
    model: Model, link: Interconnect, workers: int, fp16: bool = False, accumulate: int = 1, overlap: float = 0.0
) -> float:
    """Throughput of `workers` over `workers` x one worker without sync. `overlap`: share of the
    compute that can hide the all-reduce (0: rayparallel today; Horovod overlaps with backprop)."""
    compute = model.seconds_per_sample * model.batch * accumulate
    sync = ring_allreduce_s(workers, model.parameters * (2 if fp16 else 4), link)
    exposed = max(0.0, sync - overlap * compute)
    return compute / (compute + exposed)


def fit_this_machine(results: dict) -> dict:
    """Compute per sample and the CPU ring's latency and bandwidth, from a benchmarks.run JSON."""
    rows = results["sync"]
    xs, ys = [r["bytes"] for r in rows], [r["gradient_sync_s"] for r in rows]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum((x - mean_x) ** 2 for x in xs)
    intercept = mean_y - slope * mean_x
    # 2 workers: 2 ring steps of latency, 2(N-1)/N = 1 times the bytes over the bandwidth
    return {
        "seconds_per_sample": 1 / results["samples_per_s"]["rp_1w"]["median"],
        "ring_latency_s": intercept / 2,
        "ring_bandwidth_bytes_per_s": 1 / slope,
    }


def projections() -> list[dict]:
    rows = []
    for model in MODELS:
        for link in INTERCONNECTS:
            for fp16, accumulate in ((False, 1), (True, 1), (False, 4)):
                rows.append(
                    {
                        "model": model.name,
                        "interconnect": link.name,
                        "fp16": fp16,
                        "accumulate": accumulate,
                        "efficiency": {n: efficiency(model, link, n, fp16, accumulate) for n in WORKERS},
                        "samples_per_s": {
                            n: n
                            * model.batch
                            / (model.seconds_per_sample * model.batch / efficiency(model, link, n, fp16, accumulate))
                            for n in WORKERS
                        },
                    }
                )
    return rows


def table(rows: list[dict], fitted: dict | None) -> str:
    lines = []
    if fitted:
        lines += [
            f"this machine (fitted): {fitted['seconds_per_sample'] * 1e6:.0f} us per sample (1 CPU worker), "
            f"CPU ring latency {fitted['ring_latency_s'] * 1e3:.2f} ms per step, "
            f"bandwidth {fitted['ring_bandwidth_bytes_per_s'] / 2**20:.0f} MiB/s",
            "",
        ]
    lines.append("| model | interconnect | sync | " + " | ".join(f"{n} workers" for n in WORKERS) + " |")
    lines.append("| --- | --- | --- | " + " | ".join("---" for _ in WORKERS) + " |")
    for row in rows:
        mode = "fp16" if row["fp16"] else (f"accumulate {row['accumulate']}" if row["accumulate"] > 1 else "exact")
        cells = [f"{row['efficiency'][n]:.2f} ({row['samples_per_s'][n]:,.0f}/s)" for n in WORKERS]
        lines.append(f"| {row['model']} | {row['interconnect']} | {mode} | " + " | ".join(cells) + " |")
    model, link, workers, published = HOROVOD
    plain, hidden = efficiency(model, link, workers), efficiency(model, link, workers, overlap=0.5)
    lines += [
        "",
        f"check: {model.name}, {link.name}, {workers} GPUs: projected {plain:.2f} without overlap, "
        f"{hidden:.2f} with half the compute hiding the all-reduce; published ~{published:.2f} (Horovod, "
        "which overlaps the all-reduce with backprop)",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description="project rayparallel's scaling past this machine")
    parser.add_argument("--results", default="benchmarks/results.json", help="a benchmarks.run JSON (for the fit)")
    parser.add_argument("--json", default=None, help="also write the projections here")
    args = parser.parse_args()
    path = Path(args.results)
    fitted = fit_this_machine(json.loads(path.read_text())) if path.is_file() else None
    rows = projections()
    print(table(rows, fitted))
    if args.json:
        Path(args.json).write_text(json.dumps({"fitted": fitted, "projections": rows}, indent=2))


if __name__ == "__main__":
    main()
