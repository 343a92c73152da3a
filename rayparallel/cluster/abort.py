"""Ctrl-C aborts Ray Train's controller, as `trainer.fit()` does when it runs in the main thread.

Our `fit()` runs in a thread (the main thread shows the recorder's events), where Ray Train
registers no SIGINT handler. Without an abort, that thread stays blocked on the controller; once
Ray shuts down (at exit, or a local Ray's session end) its next call into Ray ends the whole
process with exit code 1, racing our 130. So the controller hands its own handle to the driver
(through the recorder's events), and the driver aborts it and lets the thread end first.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import ray
from ray.exceptions import RayActorError

from ..hooks import hook
from ..recorder.events import ControllerStarted

if TYPE_CHECKING:
    from ray.actor import ActorHandle

ControllerCallback = hook("controller_callback")  # a base class: resolved when this module is imported

ABORT_TIMEOUT_S = 60.0


class ControllerAnnounced(ControllerCallback):
    """Runs in the controller: its handle to the recorder, which passes it to the driver as an event."""

    def __init__(self, recorder: ActorHandle):
        self._recorder = recorder

    def after_controller_start(self, train_run_context) -> None:
        # not awaited: the controller's loop is async, and a blocking get there would stall it
        self._recorder.announce.remote(ControllerStarted(ray.get_runtime_context().current_actor))


def abort_training(controller: ActorHandle | None, fit_thread: threading.Thread) -> None:
    """Stop the workers and wait for the thread in `fit()` to return (the controller is gone then)."""
    if controller is not None:
        try:
            ray.get(controller.abort.remote(), timeout=ABORT_TIMEOUT_S)
        except (RayActorError, ray.exceptions.GetTimeoutError):  # abort ends the controller's process
            pass
    fit_thread.join(timeout=ABORT_TIMEOUT_S)
