"""An MLflow client whose new sqlite store is built aside and linked into place whole.

MLflow builds a sqlite store's tables with dozens of migrations that are not one transaction:
a process killed while they run (a recorder lost in its first epoch, a Ctrl-C at the start)
leaves a store that no later process can open ("duplicate column name: routing_strategy").
Built under another name and linked to the real one only when complete, a store is either
absent or whole; of two processes building at once, the first to link wins and the other's
copy (the same empty tables) is dropped.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

SQLITE = "sqlite:///"


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a plain `sqlite:///PATH` store (relative to this process's folder), else None.

    >>> sqlite_path("sqlite:///runs/mlflow.db"), sqlite_path("sqlite:////tmp/m.db")
    (PosixPath('runs/mlflow.db'), PosixPath('/tmp/m.db'))
    >>> sqlite_path("http://127.0.0.1:5000") is None, sqlite_path("sqlite:///m.db?timeout=5") is None
    (True, True)
    """
    if not tracking_uri.startswith(SQLITE) or "?" in tracking_uri:
        return None
    return Path(tracking_uri.removeprefix(SQLITE))


def build_store_aside(database: Path) -> None:
    """Make `database` a complete MLflow store if it does not exist yet (see the module's docstring)."""
    from mlflow.tracking import MlflowClient

    if database.exists() or not database.parent.is_dir():  # a missing folder: MLflow's own error says so
        return
    aside = database.with_name(f".{database.name}.building-{os.getpid()}")
    try:
        MlflowClient(f"{SQLITE}{aside.resolve()}").search_experiments(max_results=1)
        with contextlib.suppress(FileExistsError):  # another process linked its store first
            os.link(aside, database)
    finally:
        for leftover in (aside, aside.with_name(aside.name + "-journal")):
            leftover.unlink(missing_ok=True)


def mlflow_client(tracking_uri: str) -> MlflowClient:
    """`MlflowClient(tracking_uri)`, a new sqlite store built whole first."""
    from mlflow.tracking import MlflowClient

    database = sqlite_path(tracking_uri)
    if database is not None:
        build_store_aside(database)
    return MlflowClient(tracking_uri)
