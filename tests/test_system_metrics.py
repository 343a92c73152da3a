"""The node sampler behind MLflow's System Metrics tab (pure psutil: no Ray, no MLflow)."""

from __future__ import annotations

import os
import threading
import time

from rayparallel.worker.system_metrics import NodeSampler

MLFLOW_NAMES = {  # mlflow.system_metrics.metrics: CPUMonitor, DiskMonitor, NetworkMonitor
    "cpu_utilization_percentage",
    "system_memory_usage_megabytes",
    "system_memory_usage_percentage",
    "disk_usage_percentage",
    "disk_usage_megabytes",
    "disk_available_megabytes",
    "network_receive_megabytes",
    "network_transmit_megabytes",
}


def test_samples_carry_mlflows_names_this_process_and_numbered_steps_until_stopped():
    samples: list[tuple[dict, int, float]] = []
    three = threading.Event()

    def send(metrics: dict, step: int, at: float) -> None:
        samples.append((metrics, step, at))
        if len(samples) == 3:
            three.set()

    sampler = NodeSampler(0.05, send, lambda: [os.getpid()]).start()
    busy_until = time.monotonic() + 0.3
    while time.monotonic() < busy_until:  # this process works: its own CPU figure is above zero
        sum(range(10_000))
    assert three.wait(10)
    count = len(samples)
    sampler.stop()
    assert len(samples) in (count + 1, count + 2)  # the last one at once (and one being sent)
    time.sleep(0.2)
    count = len(samples)
    time.sleep(0.2)
    assert len(samples) == count  # stopped: no more samples
    assert [s for _, s, _ in samples] == list(range(count))

    metrics, step, at = samples[0]
    assert set(metrics) >= MLFLOW_NAMES | {"rayparallel_workers_cpu_percentage", "rayparallel_workers_memory_megabytes"}
    assert [s for _, s, _ in samples[:3]] == [0, 1, 2] and abs(at - time.time()) < 10
    assert 0 < metrics["system_memory_usage_percentage"] < 100 and metrics["disk_available_megabytes"] > 0
    assert metrics["rayparallel_workers_memory_megabytes"] > 10  # this Python process's resident memory
    assert max(f["rayparallel_workers_cpu_percentage"] for f, _, _ in samples) > 0
    assert not [key for key in metrics if key.startswith("gpu_")]  # no NVIDIA driver here: nothing said


def test_only_the_nodes_lowest_rank_sends():
    samples: list = []
    sampler = NodeSampler(0.02, lambda *sample: samples.append(sample), lambda: [1, os.getpid()]).start()
    time.sleep(0.2)
    sampler.stop()
    assert samples == []  # pid 1 is the node's lowest rank here: it samples, this worker does not
