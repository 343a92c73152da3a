"""What an operator watches of the stream replicas, as Ray metrics (`ray.serve.metrics`: tagged with the
application, deployment and replica, exported to the Ray dashboard and Prometheus as `ray_rayparallel_serve_*`
beside Ray Serve's own request metrics). Figures only: nothing is logged per request."""

from __future__ import annotations

PREFIX = "rayparallel_serve_"
FILL_BOUNDARIES = [0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0]


class StreamMetrics:
    """One replica's: slots held, streams started, ended, timed out and taken over, and each step's fill."""

    def __init__(self, slots: int):
        from ray.serve.metrics import Counter, Gauge, Histogram

        self.slots = slots
        self.occupied = Gauge(f"{PREFIX}slots_occupied", description="Slots holding a live stream.")
        self.capacity = Gauge(f"{PREFIX}slots", description="Slots of the replica (the model's batch).")
        self.events = {
            event: Counter(f"{PREFIX}streams_{event}", description=description)
            for event, description in [
                ("started", "Streams started (sequence_start)."),
                ("ended", "Streams ended (sequence_end)."),
                ("timed_out", "Streams freed after the idle timeout."),
                ("taken_over", "Streams continued here from their kept state (a replica died, or the ring moved)."),
            ]
        }
        self.fill = Histogram(
            f"{PREFIX}batch_fill",
            description="Windows of a model step over the slots: how full each step's batch is.",
            boundaries=FILL_BOUNDARIES,
        )
        self.capacity.set(slots)
        self.occupied.set(0)

    def count(self, event: str, streams: int = 1) -> None:
        if streams:
            self.events[event].inc(streams)

    def step(self, windows: int, occupied: int) -> None:
        self.fill.observe(windows / self.slots)
        self.occupied.set(occupied)
