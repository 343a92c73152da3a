"""What the recorder has acknowledged, kept on disk so that a restarted recorder carries on.

Ray restarts the recorder's actor when its process dies (`max_restarts`), runs its constructor
again with the same arguments and retries the calls it was in (`max_task_retries`). Weight
files, resume points and the manifest are files already; what else the recorder holds (each
epoch's logs, who trains, the stops decided, the start-up marks, the MLflow run's id) is
written here as it changes: a small JSON file, replaced atomically.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from ..files import WriteError, atomic_write_text

JOURNAL = "recorder.json"


class RecorderJournal:
    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self.error: str | None = None  # why the newest write failed, if it did
        self._written: str | None = None  # what the file holds: an unchanged state is not written again

    def read(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None

    def write(self, state: dict) -> bool:
        """False when it could not be written (a full disk): the run goes on, a restart would know less."""
        text = json.dumps(state, default=float)
        with self._lock:  # calls come from the recorder's two threads; the newest state wins
            if text == self._written:
                return True
            try:
                atomic_write_text(self.path, text, "--output-dir")
            except WriteError as exc:
                self.error = str(exc)
                return False
            self.error, self._written = None, text
            return True
