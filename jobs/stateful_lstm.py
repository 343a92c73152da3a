"""Default job: a stateful LSTM forecasting Mauna Loa CO2 `horizon` weeks ahead.

Data: `data/co2_mauna_loa_weekly.csv`, weekly CO2 (ppmv) at Mauna Loa, March 1958 to
December 2001 (Keeling & Whorf, CDIAC; public domain), as shipped by statsmodels
(`statsmodels.datasets.co2`). Missing weeks are filled by linear interpolation.

The series is cut into `global_batch_size` contiguous streams; row i of every batch
continues stream i, which is what a stateful LSTM with batch B expects. The model predicts
the change of the level over the next `horizon` weeks from two stationary inputs (the
weekly change and the level's distance from its trailing one-year mean), so its loss is the
squared error of the level forecast; the naive forecast (last value carried forward)
predicts no change.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jobs.parquet import write_splits

CSV = Path(__file__).parent / "data" / "co2_mauna_loa_weekly.csv"


def build_model(batch_size: int, window: int = 8, units: int = 32):
    import keras

    inputs = keras.Input(batch_shape=(batch_size, window, 2), name="co2_features")
    hidden = keras.layers.LSTM(units, stateful=True, return_sequences=True)(inputs)
    outputs = keras.layers.Dense(1, name="change")(hidden)
    return keras.Model(inputs, outputs, name="co2_lstm")


def load_series() -> np.ndarray:
    values = np.genfromtxt(CSV, delimiter=",", skip_header=1, usecols=1)
    missing = np.isnan(values)
    index = np.arange(len(values))
    values[missing] = np.interp(index[missing], index[~missing], values[~missing])
    return values


def load_data(global_batch_size: int, window: int = 8, horizon: int = 8, val_fraction: float = 0.2) -> dict:
    level = load_series()
    trailing = np.convolve(level, np.ones(52) / 52, mode="full")[: len(level)]
    features = np.stack([np.diff(level, prepend=level[0]), level - trailing], axis=1)[52:]
    change = (np.roll(level, -horizon) - level)[52:]
    features, change = features[:-horizon], change[:-horizon]

    cut = int(len(change) * (1 - val_fraction))
    feat_scale = features[:cut].std(axis=0)
    change_scale = change[:cut].std()
    features, change = features / feat_scale, change / change_scale
    x_train, y_train = as_streams(features[:cut], change[:cut], global_batch_size, window)
    x_val, y_val = as_streams(features[cut:], change[cut:], global_batch_size, window)
    naive = float(np.mean(y_val**2))  # last value carried forward = predicting zero change
    return {
        "x_train": x_train,
        "y_train": y_train,
        "x_val": x_val,
        "y_val": y_val,
        "baselines": {"naive (last value carried forward)": {"val_loss": naive}},
    }


def as_streams(features: np.ndarray, target: np.ndarray, streams: int, window: int):
    """Rows ordered window by window, stream by stream: row t*streams + i is window t of stream i."""
    length = len(target) // streams
    windows = length // window
    usable = windows * window
    f = features[: streams * length].reshape(streams, length, -1)[:, :usable]
    y = target[: streams * length].reshape(streams, length)[:, :usable]
    f = f.reshape(streams, windows, window, -1).transpose(1, 0, 2, 3).reshape(-1, window, f.shape[-1])
    y = y.reshape(streams, windows, window).transpose(1, 0, 2).reshape(-1, window, 1)
    return f.astype("float32"), y.astype("float32")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Write the CO2 streams as parquet files for Ray Data")
    parser.add_argument("--write-data", required=True, metavar="DIR")
    parser.add_argument("--global-batch-size", type=int, default=8, help="the number of streams")
    args = parser.parse_args()
    arrays = load_data(args.global_batch_size)
    b = args.global_batch_size
    extra = {
        s: {"stream": np.arange(len(arrays[f"y_{s}"])) % b, "t": np.arange(len(arrays[f"y_{s}"])) // b}
        for s in ("train", "val")
    }
    write_splits(args.write_data, arrays, files=4, extra=extra)
