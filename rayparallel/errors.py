"""Errors a user can act on.

Everything raised as :class:`RayParallelError` is a problem with the user's input (job file,
builder, loader, data, paths). The CLI prints its one-line message and exits with code 2;
anything else is a bug or an infrastructure failure and keeps its traceback.
"""

from __future__ import annotations

import re

from .secrets import mask_text


class RayParallelError(Exception):
    """A bad input, reported as one line: what was expected, what was received."""


class SpecError(RayParallelError):
    """The job spec (YAML or overrides) does not describe a valid job."""


class DataError(RayParallelError):
    """The loader's arrays cannot be split into full, equal global batches."""


class ModelError(RayParallelError):
    """The builder did not return a Keras model that fits the per-worker batch."""


def describe(value: object) -> str:
    """Short, readable description of a received value for error messages."""
    text = " ".join(repr(value).split())  # one line: an array's repr has several
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


class NonFiniteLossError(RayParallelError):
    """The training loss became NaN or infinite (`train.on_nan: stop`)."""


class StepTimeoutError(RuntimeError):
    """No training step finished within `run.collective_timeout_s` (a peer died or hangs).

    Not bad input: an infrastructure failure, so it keeps its traceback; its message names the
    rank that gave up and the setting to change.
    """


class RunFailedError(RuntimeError):
    """A process the run needs died (the run's recorder, Ray Train's controller), or a disk it
    writes failed mid-run: not bad input.

    The CLI prints its one line (what died, Ray's reason, how to continue) and exits 1;
    `--debug` shows the traceback of the death it was raised from.
    """


def first_line(exc: BaseException, limit: int | None = None) -> str:
    """An exception's message as one line (its type's name when it has none), for one-line errors."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    return text[:limit] if limit else text


def user_error(error: BaseException, storage_path: str) -> RayParallelError | None:
    """The user's bad input raised inside a worker, unwrapped from Ray's failure wrappers."""
    if "Unable to set up cluster storage" in str(error):  # Ray Train's check from every node
        return RayParallelError(
            f"run.storage_path: expected shared storage that every node can read and write for a multi-node "
            f"run (an NFS mount, s3://..., gs://...), received {mask_text(storage_path)!r}"
        )
    failures = getattr(error, "worker_failures", None) or {}
    for failure in [error, *failures.values()]:
        seen = set()
        while failure is not None and id(failure) not in seen:
            seen.add(id(failure))
            inner = getattr(failure, "cause", None)  # Ray's task error, also when it poses as its cause's class
            if isinstance(failure, RayParallelError) and not isinstance(inner, BaseException):
                return failure
            failure = inner or failure.__cause__
    return None


def death_reason(error: BaseException) -> str:
    """Why Ray says a process died, in its own words: the exit detail, else the message's first line."""
    text = str(error)
    found = re.search(r"Worker exit detail: *([^\n]+)", text) or re.search(r"The actor is dead because *([^\n]+)", text)
    return (found.group(1) if found else first_line(error)).strip().rstrip(".")
