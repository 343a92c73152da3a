"""The output folder's lock: one live run at a time, never stuck after a killed driver (no Ray)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from rayparallel.cluster.run_state import LOCK_FILE, folder_held
from rayparallel.errors import RayParallelError

from .helpers import REPO

HOLDER = """
import sys, time
from pathlib import Path
from rayparallel.cluster.run_state import folder_held
with folder_held(Path(sys.argv[1]), "first-job"):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_live_run_holds_its_folder_and_a_killed_one_leaves_it_free(tmp_path):
    driver = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert driver.stdout.readline().strip() == "held"
        with pytest.raises(RayParallelError) as info:
            with folder_held(tmp_path, "second-job"):
                pass
        text = str(info.value)
        assert text.startswith(f"--output-dir: expected a folder no live run is writing to, received '{tmp_path}'")
        assert f"held by job 'first-job', pid {driver.pid} on " in text and "\n" not in text
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    started = time.monotonic()
    with folder_held(tmp_path, "second-job"):  # the kernel released the dead driver's lock
        assert "second-job" in (tmp_path / LOCK_FILE).read_text()
    assert time.monotonic() - started < 1
