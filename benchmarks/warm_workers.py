"""The notebook loop's start-up: the default job twice from one Python process (the second call on the
workers kept warm), against the cold command line.

Run: python -m benchmarks.warm_workers [--epochs 15]

Each case runs in a fresh folder holding a copy of `jobs/` with MLflow's default store there,
on a local Ray of its own (no RAY_ADDRESS), as a user types it: (a) `rayparallel train
jobs/stateful_lstm.yaml` as a new process, its phases counted from the process's start; (b) a
script calling `rayparallel.train` on the same job twice (then a third time with 1 worker,
which replaces the group), each call's phases counted from the call. Prints each call's first
step and whole time, and the phases.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = """
import json, sys, time
import rayparallel

calls = []
for workers in (2, 2, 1):
    started = time.time()
    result = rayparallel.train("jobs/stateful_lstm.yaml", overrides=[f"train.epochs={sys.argv[1]}",
                               f"scaling.num_workers={workers}"], verbose=False)
    calls.append({"workers": workers, "whole_s": round(time.time() - started, 1), "startup": result.startup})
print("CALLS", json.dumps(calls))
"""


def fresh_folder(root: Path, name: str) -> Path:
    folder = root / name
    shutil.copytree(REPO / "jobs", folder / "jobs")
    return folder


def environment() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}


def cold_cli(root: Path, epochs: int) -> dict:
    folder = fresh_folder(root, "cli")
    started = time.time()
    command = [str(Path(sys.executable).with_name("rayparallel")), "train", "jobs/stateful_lstm.yaml"]
    subprocess.run([*command, "--set", f"train.epochs={epochs}"], cwd=folder, env=environment(), check=True,
                   capture_output=True)  # fmt: skip
    result = json.loads((folder / "runs/stateful-lstm-co2/result.json").read_text())
    return {"workers": 2, "whole_s": round(time.time() - started, 1), "startup": result["startup"]}


def python_calls(root: Path, epochs: int) -> list[dict]:
    folder = fresh_folder(root, "python")
    (folder / "calls.py").write_text(SCRIPT)
    run = subprocess.run([sys.executable, "calls.py", str(epochs)], cwd=folder, env=environment(), check=True,
                         capture_output=True, text=True)  # fmt: skip
    (line,) = [line for line in run.stdout.splitlines() if line.startswith("CALLS ")]
    return json.loads(line.removeprefix("CALLS "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rp-warm-") as root:
        cases = {"cold CLI": cold_cli(Path(root), args.epochs)}
        for label, call in zip(("python call 1", "python call 2 (warm)", "python call 3 (1 worker)"),
                               python_calls(Path(root), args.epochs), strict=True):  # fmt: skip
            cases[label] = call
    for label, case in cases.items():
        first = case["startup"].get("first_step_done")
        print(f"{label}: {case['workers']} workers, first step after {first:.1f} s, whole {case['whole_s']:.1f} s")
        print("    " + ", ".join(f"{phase} {seconds:.1f}" for phase, seconds in case["startup"].items()))


if __name__ == "__main__":
    main()
