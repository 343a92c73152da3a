"""Keep the console to rayparallel's own lines: TensorFlow's native start-up chatter is dropped.

TensorFlow's C++ side logs before Python can configure it (`absl::InitializeLog`, oneDNN and
CPU-feature notices, `failed call to cuInit` on machines without a GPU); the environment
variable `TF_CPP_MIN_LOG_LEVEL` does not reach those lines. So the first import runs with
the process's stderr captured, and whatever is not such a known notice is written back:
real warnings and errors are never lost.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile

from .hooks import set_env_defaults

_NOTICE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\)"
    r"|[IW]\d{4} "  # absl INFO/WARNING lines: oneDNN, cudart stub, CPU features
    r"|E\d{4} .*(cuInit|cuda_|CUDA)"  # no GPU driver: expected on CPU machines
    r"|To enable the following instructions)"
)


def import_tensorflow(verbose: bool = False) -> None:
    """Import TensorFlow (and probe its devices) once, without its native start-up notices."""
    if "tensorflow" in sys.modules or verbose:
        import tensorflow  # noqa: F401

        return
    set_env_defaults("tensorflow")
    with tempfile.TemporaryFile() as capture:
        try:
            with _stderr_to(capture.fileno()):
                import tensorflow as tf

                tf.config.list_physical_devices("GPU")  # where cuInit reports a missing driver
        finally:
            capture.seek(0)
            sys.stderr.write(_kept(capture.read().decode(errors="replace")))


def _kept(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not _NOTICE.match(line))


@contextlib.contextmanager
def _stderr_to(fd: int):
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(fd, 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
