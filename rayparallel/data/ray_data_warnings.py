"""Ray Data's warnings as one console line each, not a flood in the worker logs nobody reads.

Ray Data logs what goes wrong with a plan (read tasks that cannot be scheduled: "Cluster
resources are not enough to run any task from ...", objects spilled, tasks retried) in the
process that executes it: with `layout: streams`, each worker. rayparallel holds the workers'
logs back from the console, so a run starved of CPU said nothing. Each distinct warning goes
to the recorder once per worker (numbers aside), which shows it once.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

from ..recorder.events import warning_key

LOGGER = "ray.data"  # Ray Data's own loggers all propagate here (it does not propagate further)


class ForwardedWarnings(logging.Handler):
    """Passes each distinct warning's first line to `send`, prefixed `Ray Data: `, at most `limit` of them."""

    def __init__(self, send: Callable[[str], None], limit: int = 20):
        super().__init__(logging.WARNING)
        self._send, self._limit = send, limit
        self._seen: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage().strip().splitlines()[0]
            key = warning_key(text)
            if key in self._seen or len(self._seen) >= self._limit:
                return
            self._seen.add(key)
            self._send(f"Ray Data: {text}")
        except Exception:  # a handler never fails the code that logs
            self.handleError(record)


@contextlib.contextmanager
def ray_data_warnings_sent(send: Callable[[str], None]) -> Iterator[None]:
    """Ray Data's warnings in this process go to `send` while the block runs."""
    import ray.data  # noqa: F401  (configures Ray Data's logger, which drops the handlers it finds)

    logger = logging.getLogger(LOGGER)
    handler = ForwardedWarnings(send)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
