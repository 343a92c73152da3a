"""The step watchdog on its own, in a child process (it may end the process): a worker stuck
outside TensorFlow ends after the grace, one that unwinds in time does not (real TF, no Ray)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import sys, threading, time
    from rayparallel.worker.sync import StepWatchdog

    noted = []
    dog = StepWatchdog(0.5, lambda reason: noted.append(reason), grace_s=1.0)
    dog.beat()  # one step finished: armed
    if sys.argv[1] == "stuck":
        threading.Event().wait(30)  # a barrier outside TensorFlow that never opens
        print("woke up")
    else:
        time.sleep(1.0)  # the abort came; the loop unwinds and disarms within the grace
        dog.disarm()
        time.sleep(2.0)
        print("unwound:", noted[0])
    """
)


def run_child(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=120)


def test_a_worker_stuck_outside_tensorflow_ends_after_the_grace():
    done = run_child("stuck")
    assert done.returncode == 1, done.stderr[-2000:]
    assert "woke up" not in done.stdout
    assert "run.collective_timeout_s: expected a step to finish within 0.5 s, received none" in done.stderr


def test_a_worker_that_unwinds_within_the_grace_is_not_ended():
    done = run_child("unwinds")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "unwound: run.collective_timeout_s: expected a step to finish within 0.5 s" in done.stdout
