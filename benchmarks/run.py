"""All benchmarks in one invocation, interleaved and repeated: `python -m benchmarks.run [--quick] [--json PATH]`.

(a) overhead: rayparallel on 1 worker against plain Keras `fit` and a bare MWMS loop on
    Ray's TensorflowTrainer (same VGG model, batch, data, 1 thread);
(b) scaling: rayparallel on 2 workers x 1 thread against 1 worker x 1 thread, and against
    Keras `fit` with 2 threads; beside it the bare MWMS loop on 2 workers and two workers
    that do not synchronize at all (what two processes can do on this machine);
(c) gradient sync: seconds per synchronization against gradient bytes (VGG models of
    several widths), against a raw MWMS all_reduce of the same bytes;
(d) checkpoint stall: rank 0 blocked per checkpoint of a 50M-parameter model, against a
    synchronous `save_weights` and a full `model.save` (what Ray's ReportCheckpointCallback
    does on every rank);
(e) time to first step of the default job (`rayparallel train jobs/stateful_lstm.yaml`, one
    epoch, MLflow on a temporary store) from the command line: the first run with its own new
    local Ray, a second such run (warm), and a run joining a running local Ray (as after `ray
    start --head`); and a Ray Tune trial's own start-up, from the trial's start to its first step.

Figures: a console table, a JSON file and a PNG plot. Medians of the repeats, with spreads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BATCH = 64


def rayparallel_throughput(
    workers: int, epochs: int, repeat: int, out: Path, use_gpu: bool = False, compression: str = "none"
) -> float:
    import rayparallel

    result = rayparallel.train(
        str(REPO / "jobs" / "vgg_classifier.yaml"),
        overrides=[
            f"scaling.num_workers={workers}",
            f"train.epochs={epochs}",
            f"data.kwargs.repeat={repeat}",
            f"train.global_batch_size={BATCH}",
            "mlflow.enabled=false",
            "checkpoint.enabled=false",
            "data.kwargs.seed=0",
            f"scaling.use_gpu={str(use_gpu).lower()}",
            f"train.gradient_compression={compression}",
        ],
        output_dir=out / f"rp-{workers}-{time.time_ns()}",
        verbose=False,
        resume=False,
    )
    return statistics.median(h["samples_per_s"] for h in result.history[1:])


DEFAULT_JOB = "jobs/stateful_lstm.yaml"
ONE_EPOCH = ["train.epochs=1"]


def time_to_first_step(out: Path, ray_address: str | None = None) -> dict:
    """The default job from the command line: seconds from launching the command to its first step
    (the process's own clock agrees to ~0.1 s) and result.json's start-up phases. Its own new
    local Ray, or joining the running one at `ray_address`."""
    folder = out / f"cli-{time.time_ns()}"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
    sets = [arg for key in ONE_EPOCH for arg in ("--set", key)]
    command = [sys.executable, "-m", "rayparallel.cli", "train", DEFAULT_JOB, *sets, "--output-dir", str(folder)]
    launched = time.time()
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=900)
    if run.returncode != 0:
        raise RuntimeError(f"CLI run of {DEFAULT_JOB} failed: {run.stderr[-2000:]}")
    result = json.loads((folder / "result.json").read_text())
    return {"seconds": result["first_step_at"] - launched, "startup": result["startup"]}


def tune_trial_startup(out: Path, trials: int = 3) -> dict:
    """A sweep of the default job in this process's Ray, one trial at a time: each trial's seconds from its
    start to its first step (its result.json), their median, and the phases of the first."""
    import rayparallel

    folder = out / f"tune-{time.time_ns()}"
    rates = ", ".join(str(0.005 * (i + 1)) for i in range(trials))
    rayparallel.tune(
        str(REPO / DEFAULT_JOB),
        params={"train.optimizer.config.learning_rate": f"grid({rates})", "model.kwargs.units": "choice(32)"},
        overrides=ONE_EPOCH,
        max_concurrent=1,
        output_dir=folder,
        verbose=False,
    )
    results = [json.loads(path.read_text()) for path in sorted(folder.glob("trial-*/result.json"))]
    seconds = [r["time_to_first_step_s"] for r in results]
    return {"median": statistics.median(seconds), "trials": seconds, "startup": results[0]["startup"]}


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


# The ratios, each taken within a round (the machine's speed drifts between rounds), then the
# median over rounds: (name, numerator variant, denominator variant, factor on the denominator).
RATIOS = (
    ("overhead_vs_keras_fit", "keras_fit_1t", "rp_1w", 1),
    ("overhead_vs_bare_ray", "bare_1w", "rp_1w", 1),
    ("scaling_efficiency_2w", "rp_2w", "rp_1w", 2),
    ("speedup_vs_keras_2threads", "rp_2w", "keras_fit_2t", 1),
    ("overhead_vs_bare_ray_2w", "bare_2w", "rp_2w", 1),
    ("scaling_efficiency_2w_without_sync", "nosync_2w", "rp_1w", 2),
    ("efficiency_vs_no_sync_2w", "rp_2w", "nosync_2w", 1),  # against what this machine can do at all
    ("efficiency_vs_no_sync_2w_fp16", "rp_2w_fp16", "nosync_2w", 1),
)


def ratios(raw: dict[str, list[float]]) -> dict[str, Any]:
    """Each ratio of RATIOS per round, their median under its name and the rounds under `<name>_rounds`."""
    figures: dict[str, Any] = {}
    for name, top, bottom, factor in RATIOS:
        per_round = [a / (factor * b) for a, b in zip(raw[top], raw[bottom], strict=True)]
        figures[name] = statistics.median(per_round)
        figures[name + "_rounds"] = per_round
    return figures


def measure(quick: bool, rounds: int) -> dict:
    import ray

    from benchmarks import baselines
    from benchmarks.checkpoint_stall import measure as checkpoint_stall

    epochs, repeat = (3, 2) if quick else (4, 4)
    out = Path(tempfile.mkdtemp(prefix="rayparallel-bench-"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{out}/mlflow.db"  # every run here: never the clone's mlflow.db
    storage = str(out / "ray")
    ray.init(
        address="local",
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"TF_CPP_MIN_LOG_LEVEL": "2"}},
    )
    gpu = ray.cluster_resources().get("GPU", 0) >= 2  # a GPU box: every Ray Train variant on GPUs, NCCL
    variants = {
        "keras_fit_1t": lambda: baselines.keras_fit(1, epochs, BATCH, repeat),
        "bare_1w": lambda: baselines.bare_loop(1, epochs, BATCH, repeat, storage, use_gpu=gpu),
        "rp_1w": lambda: rayparallel_throughput(1, epochs, repeat, out, gpu),
        "rp_2w": lambda: rayparallel_throughput(2, epochs, repeat, out, gpu),
        "rp_2w_fp16": lambda: rayparallel_throughput(2, epochs, repeat, out, gpu, compression="fp16"),
        "bare_2w": lambda: baselines.bare_loop(2, epochs, BATCH, repeat, storage, use_gpu=gpu),
        "nosync_2w": lambda: baselines.bare_loop(2, epochs, BATCH, repeat, storage, sync=False, use_gpu=gpu),
        "keras_fit_2t": lambda: baselines.keras_fit(2, epochs, BATCH, repeat),
    }
    raw: dict[str, list[float]] = {k: [] for k in variants}
    try:
        for r in range(rounds):  # interleaved: every variant once per round
            print(f"round {r + 1}/{rounds}", flush=True)
            for key, run in variants.items():
                raw[key].append(run())
                print(f"  {key}: {raw[key][-1]:.0f} samples/s", flush=True)
        sync = baselines.sync_probe(
            iterations=20 if quick else 50, repeats=3 if quick else 7, storage=storage, use_gpu=gpu
        )
        stall = checkpoint_stall(repeats=2 if quick else 5, full_save=True)
        print("start-up: a run joining this Ray, a Tune trial", flush=True)
        joined = time_to_first_step(out, ray_address=ray.get_runtime_context().gcs_address)
        trial = tune_trial_startup(out)
    finally:
        ray.shutdown()
    print("start-up: runs with their own local Ray", flush=True)
    own = [time_to_first_step(out) for _ in range(2 if quick else 3)]  # the first, then warm ones
    warm = own[1:]

    benchmark_model = next(row for row in sync if row["filters"] == 32)  # jobs/vgg_classifier.yaml's width
    figures = {
        "machine": machine(),
        "gpu": gpu,
        "quick": quick,
        "samples_per_s": {k: spread(v) for k, v in raw.items()},
    }
    figures.update(ratios(raw))
    figures.update(
        {
            "sync": sync,
            "sync_vs_raw_allreduce": benchmark_model["gradient_sync_s"] / benchmark_model["raw_allreduce_s"],
            "checkpoint": stall,
            "checkpoint_stall_vs_sync_save": stall["stall_vs_sync_save"],
            "sync_fp16_vs_none": benchmark_model["gradient_sync_fp16_s"] / benchmark_model["gradient_sync_s"],
            "time_to_first_step_s": statistics.median(run["seconds"] for run in warm),  # warm: its own local Ray
            "time_to_first_step_first_run_s": own[0]["seconds"],
            "time_to_first_step_joined_s": joined["seconds"],  # into a running local Ray
            "time_to_first_step_runs_s": [run["seconds"] for run in own],
            "tune_trial_startup_s": trial["median"],
            "tune_trial_startup_runs_s": trial["trials"],
            "startup": min(warm, key=lambda run: run["seconds"])["startup"],  # the fastest warm run's phases
            "startup_phases": {
                "first_run": own[0]["startup"],
                "joined": joined["startup"],
                "tune_trial": trial["startup"],
            },
        }
    )
    return figures


def machine() -> str:
    import platform

    with open("/proc/cpuinfo") as lines:
        cpu = next((x.split(":", 1)[1].strip() for x in lines if x.startswith("model name")), platform.processor())
    with open("/proc/meminfo") as lines:
        memory = int(next(x.split()[1] for x in lines if x.startswith("MemTotal"))) // 2**20
    gpus = (
        subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.count("GPU")
        if shutil.which("nvidia-smi")
        else 0
    )
    accelerators = f"{gpus} GPU(s)" if gpus else "no GPU"
    return f"{os.cpu_count()} cores ({cpu}), {memory} GiB, {accelerators}, Python {platform.python_version()}"


def table(f: dict) -> str:
    s = f["samples_per_s"]

    def ratio(key: str) -> str:  # median of the per-round ratios [their range]
        rounds = f[key + "_rounds"]
        return f"{f[key]:.3f}  [{min(rounds):.3f}-{max(rounds):.3f}]"

    rows = [
        ("(a) overhead vs Keras fit (step time ratio, target <= 1.05)", ratio("overhead_vs_keras_fit")),
        ("(a) overhead vs bare MWMS loop on Ray (target <= 1.02)", ratio("overhead_vs_bare_ray")),
        ("(b) scaling efficiency, 2 workers (target >= 0.9)", ratio("scaling_efficiency_2w")),
        ("(b) speedup vs Keras fit with 2 threads (target >= 1.15)", ratio("speedup_vs_keras_2threads")),
        ("(b) 2 workers: bare MWMS loop vs rayparallel (step time ratio)", ratio("overhead_vs_bare_ray_2w")),
        (
            "(b) efficiency of 2 workers that never synchronize (the machine's ceiling)",
            ratio("scaling_efficiency_2w_without_sync"),
        ),
        ("(b) 2 workers vs 2 that never synchronize, exact sync", ratio("efficiency_vs_no_sync_2w")),
        (
            "(b) 2 workers vs 2 that never synchronize, fp16 sync (target >= 0.85)",
            ratio("efficiency_vs_no_sync_2w_fp16"),
        ),
        ("(c) sync time vs raw all_reduce (target <= 1.1)", f"{f['sync_vs_raw_allreduce']:.3f}"),
        ("(c) fp16 sync time vs float32 sync", f"{f['sync_fp16_vs_none']:.3f}"),
        ("(d) checkpoint stall vs sync save_weights (target <= 0.05)", f"{f['checkpoint_stall_vs_sync_save']:.4f}"),
        ("(e) time to first step, warm CLI, own local Ray (s, target <= 12)", f"{f['time_to_first_step_s']:.1f}"),
        ("(e) time to first step, first CLI run (s, target <= 20)", f"{f['time_to_first_step_first_run_s']:.1f}"),
        ("(e) time to first step, CLI joining a running Ray (s)", f"{f['time_to_first_step_joined_s']:.1f}"),
        ("(e) Tune trial start to its first step (s, target <= 8)", f"{f['tune_trial_startup_s']:.1f}"),
    ]
    startup = ", ".join(f"{phase} {seconds:.1f}" for phase, seconds in f.get("startup", {}).items())
    lines = [f"machine: {f['machine']}", "", "throughput (samples/s, median [min-max] of repeats):"]
    for key, value in s.items():
        lines.append(f"  {key:14s} {value['median']:8.0f}  [{value['min']:.0f}-{value['max']:.0f}] n={value['n']}")
    ck = f["checkpoint"]
    lines += ["", "gradient sync on 2 workers (ms per step):"]
    for row in f["sync"]:
        lines.append(
            f"  {row['bytes'] / 2**20:6.2f} MiB in {row['tensors']} tensors: gradient sync "
            f"{row['gradient_sync_s'] * 1e3:6.2f} (fp16 {row['gradient_sync_fp16_s'] * 1e3:6.2f}, "
            f"bf16 {row['gradient_sync_bf16_s'] * 1e3:6.2f}), raw all_reduce {row['raw_allreduce_s'] * 1e3:6.2f}"
        )
    lines += [
        "",
        f"checkpoint ({ck['parameters'] / 1e6:.1f}M params): rank 0 blocked {ck['actor_blocked_s'] * 1e3:.1f} ms, "
        f"sync save_weights {ck['sync_save_weights_s'] * 1e3:.0f} ms, "
        f"full model.save {ck.get('full_save_s', 0) * 1e3:.0f} ms",
        "",
    ]
    width = max(len(r[0]) for r in rows)
    lines += [f"{name:{width}s}  {value}" for name, value in rows]
    lines += ["", f"start-up phases of the fastest warm run (s since the command started): {startup}"]
    for name, phases in f.get("startup_phases", {}).items():
        lines.append(f"  {name}: " + ", ".join(f"{phase} {seconds:.1f}" for phase, seconds in phases.items()))
    return "\n".join(lines)


def plot(f: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(16, 4))
    names = list(f["samples_per_s"])
    left.bar(names, [f["samples_per_s"][n]["median"] for n in names], color="#4c72b0")
    left.set_ylabel("samples/s (median)")
    left.set_title("VGG digits throughput, 2-core CPU")
    left.tick_params(axis="x", rotation=30)
    mib = [row["bytes"] / 2**20 for row in f["sync"]]
    middle.plot(mib, [row["gradient_sync_s"] * 1e3 for row in f["sync"]], "o-", label="gradient sync (Keras optimizer)")
    middle.plot(mib, [row["raw_allreduce_s"] * 1e3 for row in f["sync"]], "s--", label="raw MWMS all_reduce")
    middle.set_xscale("log")
    middle.set_xticks(mib, [f"{m:.2f}" for m in mib])
    middle.minorticks_off()
    middle.set_xlabel("gradient MiB")
    middle.set_ylabel("ms per synchronization, 2 workers")
    middle.set_title("gradient sync against bytes")
    middle.legend()
    ratios = {
        "overhead\nvs fit": (f["overhead_vs_keras_fit"], 1.05),
        "overhead\nvs bare": (f["overhead_vs_bare_ray"], 1.02),
        "scaling\neff.": (f["scaling_efficiency_2w"], 0.9),
        "speedup vs\nfit 2 thr.": (f["speedup_vs_keras_2threads"], 1.15),
        "sync vs\nall_reduce": (f["sync_vs_raw_allreduce"], 1.1),
    }
    right.bar(list(ratios), [v for v, _ in ratios.values()], color="#dd8452", label="measured")
    right.scatter(list(ratios), [t for _, t in ratios.values()], color="black", marker="_", s=400, label="target")
    right.set_title("ratios against targets")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description="rayparallel benchmarks")
    parser.add_argument("--quick", action="store_true", help="one round, short epochs (under 5 minutes here)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds of every variant (default 3; 1 with --quick)"
    )
    # The committed results change only when asked: --json benchmarks/results.json --plot benchmarks/results.png
    parser.add_argument("--json", default=None, help="where to write the figures (default: a temporary folder)")
    parser.add_argument("--plot", default=None, help="where to write the PNG plot (default: beside the JSON)")
    args = parser.parse_args()
    started = time.perf_counter()
    if args.rounds < 1:
        parser.error(f"--rounds: expected a positive number of rounds, received {args.rounds}")
    json_path = Path(args.json) if args.json else Path(tempfile.mkdtemp(prefix="rayparallel-bench-")) / "results.json"
    plot_path = Path(args.plot) if args.plot else json_path.with_suffix(".png")
    figures = measure(args.quick, 1 if args.quick else args.rounds)
    figures["benchmark_seconds"] = time.perf_counter() - started
    json_path.write_text(json.dumps(figures, indent=2))
    plot(figures, plot_path)
    print(table(figures))
    print(f"\nwritten: {json_path}, {plot_path} ({figures['benchmark_seconds']:.0f}s)")


if __name__ == "__main__":
    main()
