"""Writing the example jobs' data as parquet files, for the jobs that read it through Ray Data."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_splits(directory: str, arrays: dict, files: int, extra: dict | None = None) -> None:
    """`x_train`, `y_train`, `x_val`, `y_val` as `directory/{train,val}/part-NNN.parquet`, rows in order,
    columns `x`, `y` (and `extra[split]`'s, such as `stream` and `t`); files named so they sort in row order."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from ray.data.extensions import ArrowTensorArray

    for split in ("train", "val"):
        columns = {"x": arrays[f"x_{split}"], "y": arrays[f"y_{split}"], **(extra or {}).get(split, {})}
        folder = Path(directory) / split
        folder.mkdir(parents=True, exist_ok=True)
        rows = len(columns["x"])
        cuts = np.linspace(0, rows, files + 1).astype(int)
        for i, (lo, hi) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)):
            table = {
                name: ArrowTensorArray.from_numpy(v[lo:hi]) if v.ndim > 1 else pa.array(v[lo:hi])
                for name, v in columns.items()
            }
            pq.write_table(pa.table(table), folder / f"part-{i:03d}.parquet")
        print(f"wrote {rows} {split} rows to {folder} ({files} files)")


def train_split(path: str):
    """`data.dataset` of the examples: `path/train`'s parquet files, as Ray Data streams them."""
    import ray.data

    return ray.data.read_parquet(str(Path(path).resolve() / "train"))  # resolved here: Ray reads elsewhere


def val_split(path: str):
    """`data.val_dataset` of the examples: `path/val`."""
    import ray.data

    return ray.data.read_parquet(str(Path(path).resolve() / "val"))
