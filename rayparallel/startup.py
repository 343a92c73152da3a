"""Start-up, phase by phase, on one clock: seconds since the command started.

A run's first step comes after a chain of phases in three kinds of process (the driver, the
recorder actor, the workers). Each phase's end is recorded as a wall-clock time where it
happens (rank 0 for the workers' phases) and reported relative to one origin: the start of
the `rayparallel` process for the CLI, the call of `rayparallel.train` from Python. The
workers' phases assume the nodes' clocks agree (NTP), as Ray's own timeline does.
"""

from __future__ import annotations

import os
import time

# In the order they happen, but the recorder's, which may come after the workers' first phases;
# `result.json` `startup` lists those that were reached.
PHASES = (
    "spec_checked",  # driver: spec, imports, data and replica checked (preflight; after Ray for a Ray Data job)
    "ray_ready",  # driver: joined or started Ray
    "workers_reused",  # driver: the run takes the worker group this process kept warm (rayparallel.fit/train)
    "recorder_ready",  # the recorder actor is up; it starts beside the worker group (MLflow's run in its thread)
    "workers_started",  # rank 0 entered the training function
    "tensorflow_imported",
    "strategy_ready",  # MultiWorkerMirroredStrategy: every worker connected
    "data_loaded",
    "replica_built",  # model and optimizer, inside the strategy's scope
    "first_step_traced",  # the compiled train step (tf.function) traced
    "first_step_done",
)


def process_started_at() -> float:
    """Unix time this process started (its age from /proc on Linux), else now."""
    try:
        with open("/proc/self/stat") as stat:
            ticks = int(stat.read().rpartition(")")[2].split()[19])  # field 22: start, in ticks since boot
        with open("/proc/uptime") as uptime:
            since_boot = float(uptime.read().split()[0])
        return time.time() - (since_boot - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def relative(marks: dict[str, float], origin: float) -> dict[str, float]:
    """{phase: unix time} -> {phase: seconds since `origin`}, in PHASES order; phases reached before
    `origin` are left out (a worker group started ahead of the call, `rayparallel.Workers`)."""
    return {name: round(marks[name] - origin, 3) for name in PHASES if name in marks and marks[name] >= origin}


def describe(startup: dict[str, float]) -> str:
    """One console line: `spec_checked 4.1s, ray_ready 9.8s, ...`."""
    return ", ".join(f"{name} {seconds:.1f}s" for name, seconds in startup.items())
