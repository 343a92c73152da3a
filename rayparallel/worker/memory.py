"""How much memory a worker's data costs it: proportional set size (PSS), sampled.

PSS counts a page shared by k processes as 1/k in each, so arrays read from Ray's object
store by every worker of a node count once over them, as they cost the node. Linux only
(`/proc/<pid>/smaps_rollup`); elsewhere the figures are None.
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


class MemoryWatch:
    """This process's PSS when made (before any data) and its peak since, sampled by a daemon thread."""

    def __init__(self, interval_s: float = 0.2):
        self.before = self.peak = pss_bytes()
        if self.before is not None:
            threading.Thread(target=self._watch, args=(interval_s,), name="rayparallel-pss", daemon=True).start()

    def _watch(self, interval_s: float) -> None:
        while True:
            time.sleep(interval_s)
            now = pss_bytes() or 0
            self.peak = max(self.peak or 0, now)

    def figures(self) -> dict:
        """result.json's per-worker memory: PSS before the data and at its peak, in MB."""
        if self.before is None:
            return {}
        self.peak = max(self.peak, pss_bytes() or 0)
        return {"pss_before_data_mb": round(self.before / 2**20, 1), "pss_peak_mb": round(self.peak / 2**20, 1)}
