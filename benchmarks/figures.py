"""What every benchmark ends with: its figures printed in one line and, if asked, written as JSON."""

from __future__ import annotations

import json
from pathlib import Path


def report(figures: dict, line: str, json_path: str | None) -> None:
    print(line)
    if json_path:
        Path(json_path).write_text(json.dumps(figures, indent=2))
