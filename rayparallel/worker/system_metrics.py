"""A node's system metrics as MLflow names them, sampled off the step by one worker per node.

MLflow's System Metrics tab shows `system/<node>/<name>` for each node of a multi-node run;
MLflow samples only the process that started the run, which here is the recorder, on one
node. So every worker runs this sampler in a daemon thread, and the one of the lowest rank on
its node (by Ray node id: Ray Train's local ranks go by IP address, which nodes may share)
hands each sample to the recorder, whose queue to MLflow keeps it through an
outage like every other figure. The names and units are MLflow's own
(`mlflow.system_metrics.metrics`); `rayparallel_workers_*` adds the run's own worker
processes on the node. GPUs are read through NVML (`nvidia-ml-py`); a node without an
NVIDIA driver has no GPU metrics and says nothing about it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import psutil

MB = 1e6


def node_metrics(network_start: tuple[int, int]) -> dict[str, float]:
    """CPU, memory, the root disk, and the network since `network_start` (bytes received, sent)."""
    memory, disk, network = psutil.virtual_memory(), psutil.disk_usage("/"), psutil.net_io_counters()
    return {
        "cpu_utilization_percentage": psutil.cpu_percent(),  # since the previous call: the whole interval
        "system_memory_usage_megabytes": memory.used / MB,
        "system_memory_usage_percentage": memory.used / memory.total * 100,
        "disk_usage_percentage": disk.percent,
        "disk_usage_megabytes": disk.used / MB,
        "disk_available_megabytes": disk.free / MB,
        "network_receive_megabytes": (network.bytes_recv - network_start[0]) / MB,
        "network_transmit_megabytes": (network.bytes_sent - network_start[1]) / MB,
    }


def process_metrics(processes: dict[int, psutil.Process]) -> dict[str, float]:
    """CPU (percent of one core, since the previous call) and resident memory summed over `processes`."""
    cpu = rss = 0.0
    for pid, process in list(processes.items()):
        try:
            cpu += process.cpu_percent()
            rss += process.memory_info().rss
        except psutil.Error:  # ended (a restarted group): not counted again
            processes.pop(pid)
    return {"rayparallel_workers_cpu_percentage": cpu, "rayparallel_workers_memory_megabytes": rss / MB}


def gpu_metrics() -> dict[str, float]:
    """Each NVIDIA GPU of the node as MLflow's GPU monitor reports it; none without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no nvidia-ml-py, no driver, no device: a CPU node
        return {}
    metrics = {}
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        metrics[f"gpu_{i}_memory_usage_percentage"] = memory.used / memory.total * 100
        metrics[f"gpu_{i}_memory_usage_megabytes"] = memory.used / MB
        metrics[f"gpu_{i}_utilization_percentage"] = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    return metrics


class NodeSampler:
    """Every `interval_s`, the node's metrics to `send(metrics, step, unix_time)`, and once more at
    `stop` (a group shorter than the interval is on the tab too).

    `worker_pids()` names the run's worker processes on this node, lowest rank first (asked each
    time: a resized group has others); only the first of them sends."""

    def __init__(
        self,
        interval_s: float,
        send: Callable[[dict, int, float], None],
        worker_pids: Callable[[], list[int]],
    ):
        self.interval_s, self._send, self._worker_pids = interval_s, send, worker_pids
        self._stopped = threading.Event()
        self._step = 0
        self._lock = threading.Lock()  # the thread's samples and the last one, taken by `stop`, in turn
        self._processes: dict[int, psutil.Process] = {}
        network = psutil.net_io_counters()
        self._network_start = (network.bytes_recv, network.bytes_sent)
        psutil.cpu_percent()  # the first call only starts the interval
        self._thread = threading.Thread(target=self._run, name="rayparallel-system-metrics", daemon=True)

    def start(self) -> NodeSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._send_sample()

    def sample(self, pids: list[int]) -> dict[str, float]:
        for pid in pids:
            if pid not in self._processes:
                try:
                    self._processes[pid] = psutil.Process(pid)
                    self._processes[pid].cpu_percent()
                except psutil.Error:
                    continue
        metrics = node_metrics(self._network_start)
        metrics.update(process_metrics(self._processes))
        metrics.update(gpu_metrics())
        return {key: round(value, 1) for key, value in metrics.items()}

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            self._send_sample()

    def _send_sample(self) -> None:
        with self._lock:
            try:
                pids = self._worker_pids()
                if pids[:1] != [os.getpid()]:  # another worker samples this node (or none is registered yet)
                    return
                self._send(self.sample(pids), self._step, time.time())
            except Exception:  # a sample lost (the recorder restarting): the next one comes anyway
                pass
            self._step += 1
