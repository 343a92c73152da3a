"""The screenshots in docs/mlflow-ui.md: the default job trained into a real `mlflow server` on
127.0.0.1, its run's pages rendered by headless Chromium (`tests/browser.py` says what it needs);
with `--site`, the docs site's home and API reference pages instead, built with `mkdocs build --strict`.

Run from the repository: python -m docs.screenshots [--site]   (about 2 minutes, or 20 s with --site;
writes docs/images/*.png)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.browser import missing, run_pages, site_pages
from tests.helpers import REPO, MlflowServer

SETTINGS = [
    "mlflow.log_checkpoints=true",
    "mlflow.register_model=stateful_lstm",
    "mlflow.system_metrics_interval_s=2",
]


def main() -> None:
    if why := missing():
        sys.exit(f"docs.screenshots: expected Chromium and Playwright, received {why}")
    if "--site" in sys.argv[1:]:
        site()
        return
    with tempfile.TemporaryDirectory(prefix="rayparallel-docs-") as folder:
        server = MlflowServer(Path(folder))
        try:
            command = ["rayparallel", "train", "jobs/stateful_lstm.yaml", "--output-dir", f"{folder}/out"]
            for setting in [f"mlflow.tracking_uri={server.uri}", *SETTINGS]:
                command += ["--set", setting]
            subprocess.run(command, cwd=REPO, check=True)
            url = json.loads(Path(folder, "out", "result.json").read_text())["mlflow"]["url"]
            experiment, run = url.split("/experiments/")[1].split("/runs/")
            for name in run_pages(server.uri, experiment, run, REPO / "docs" / "images"):
                print(f"docs/images/{name}.png")
        finally:
            server.stop()


def site() -> None:
    with tempfile.TemporaryDirectory(prefix="rayparallel-site-") as folder:
        subprocess.run(["mkdocs", "build", "--strict", "--quiet", "--site-dir", folder], cwd=REPO, check=True)
        for name in site_pages(Path(folder), REPO / "docs" / "images"):
            print(f"docs/images/{name}.png")


if __name__ == "__main__":
    main()
