"""How much memory a worker's data costs it: proportional set size (PSS), sampled.

PSS counts a page shared by k processes as 1/k in each, so arrays read from Ray's object
store by every worker of a node count once over them, as they cost the node. Linux only
(`/proc/<pid>/smaps_rollup`); elsewhere they are None.
"""

from __future__ import annotations

import os
import threading
import time


def pss_bytes(pid: int | None = None) -> int | None:
    """A process's PSS in bytes (this one by default), or None where /proc has no smaps_rollup."""
    try:
        with open(f"/proc/{pid or os.getpid()}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def object_store_pss_bytes(pid: int | None = None) -> int | None:
    """The part of a process's PSS in Ray's object store (its /dev/shm/plasma* mapping): shared pages."""
    total, inside = 0, False
    try:
        with open(f"/proc/{pid or os.getpid()}/smaps") as smaps:
            for line in smaps:
                fields = line.split()
                if fields and "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's header line
                    inside = len(fields) > 5 and "plasma" in fields[5]
                elif inside and fields[0] == "Pss:":
                    total += int(fields[1]) * 1024
    except OSError:
        return None
    return total


class MemoryWatch:
    """This process's PSS when made (before any data) and its peak since, sampled by a daemon thread
    (once a second: a read of smaps_rollup costs a TensorFlow process about 10 ms of kernel time)."""

    def __init__(self, interval_s: float = 1.0):
        self.before = self.peak = pss_bytes()
        if self.before is not None:
            threading.Thread(target=self._watch, args=(interval_s,), name="rayparallel-pss", daemon=True).start()

    def _watch(self, interval_s: float) -> None:
        while True:
            time.sleep(interval_s)
            now = pss_bytes() or 0
            self.peak = max(self.peak or 0, now)

    def megabytes(self) -> dict:
        """result.json's per-worker memory in MB: PSS before the data, at its peak, and the part of it
        now in Ray's object store (this worker's share of pages the node's workers read together)."""
        if self.before is None:
            return {}
        self.peak = max(self.peak, pss_bytes() or 0)
        mb = {"before_data": self.before, "peak": self.peak, "object_store": object_store_pss_bytes() or 0}
        return {f"pss_{key}_mb": round(value / 2**20, 1) for key, value in mb.items()}
