"""Predictions as Arrow tables: the rows' key columns, then one column per model output.

A multi-dimensional output (a sequence model's `(window, 1)` per row) is an Arrow
`fixed_shape_tensor` column, which Parquet keeps with its shape: read it back with
`table.column(name).combine_chunks().to_numpy_ndarray()`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import RayParallelError
from ..files import atomic_write_text

SUMMARY = "predict.json"
PARTS = "part-*.parquet"


def output_table(keys: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> Any:
    """One Arrow table: the key columns as given, each output as a plain or a tensor column."""
    import pyarrow as pa

    columns = {name: pa.array(np.asarray(values)) for name, values in keys.items()}
    for name, values in outputs.items():
        values = np.ascontiguousarray(values)
        columns[name] = pa.array(values) if values.ndim == 1 else pa.FixedShapeTensorArray.from_numpy_ndarray(values)
    return pa.table(columns)


def fresh_names() -> None:
    """Keras' layer names as in a new process (`dense`, not `dense_7`): a task may run in a reused
    Ray worker where earlier models took them, and the output columns are named after the output layers."""
    import keras

    keras.utils.clear_session()


def named_outputs(model: Any, predicted: Any) -> dict[str, np.ndarray]:
    """`predict_on_batch`'s result by output name (one array, a list, or a dict of them)."""
    names = list(model.output_names)
    if isinstance(predicted, dict):
        return {name: np.asarray(predicted[name]) for name in names}
    if isinstance(predicted, (list, tuple)):
        return {name: np.asarray(value) for name, value in zip(names, predicted, strict=True)}
    return {names[0]: np.asarray(predicted)}


def check_folder(out: Path, overwrite: bool) -> None:
    """`out` can take a new prediction: a folder holding an earlier one only with `overwrite` (nothing is
    written here: `clear_folder` makes the folder once every other check has passed)."""
    from ..files import refuse_unwritable

    refuse_unwritable(out, "--out")
    held = _earlier(out)
    if held and not overwrite:
        raise RayParallelError(
            f"--out: expected a folder without an earlier prediction, received {str(out)!r} holding "
            f"{held[0].name}{f' and {len(held) - 1} more files' if len(held) > 1 else ''} (--overwrite replaces it)"
        )


def clear_folder(out: Path) -> None:
    """`out` made (or refused in one line) and an earlier prediction's files removed: the new one is next."""
    from ..files import ensure_writable

    ensure_writable(out, "--out")
    for path in _earlier(out):
        path.unlink()


def _earlier(out: Path) -> list[Path]:
    if not out.is_dir():
        return []
    return [p for p in [out / SUMMARY, *sorted(out.glob(PARTS))] if p.is_file()]


def write_part(out: Path, index: int, table: Any) -> Path:
    import pyarrow.parquet as pq

    path = out / f"part-{index:05d}.parquet"
    pq.write_table(table, path)
    return path


def write_summary(out: Path, summary: dict) -> Path:
    path = out / SUMMARY
    atomic_write_text(path, json.dumps(summary, indent=2, default=str), "--out")
    return path


def read_predictions(out: str | Path) -> dict[str, np.ndarray]:
    """Every part of a prediction folder as arrays by column (tensor columns with their shapes).

    Examples:
        >>> columns = read_predictions("runs/predict")  # doctest: +SKIP
        >>> columns["stream"], columns["t"], columns["change"].shape  # doctest: +SKIP
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = [pq.read_table(path) for path in sorted(Path(out).glob(PARTS))]
    if not parts:
        return {}
    table = pa.concat_tables(parts)
    columns = {}
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        columns[name] = column.to_numpy_ndarray() if isinstance(column, pa.FixedShapeTensorArray) else column.to_numpy()
    return columns
