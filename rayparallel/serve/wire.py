"""The bytes of a message between a replica and the keeper: a JSON header, then the arrays' raw bytes.

No pickle crosses the keeper's port (nothing that arrives there can run code): dicts with string keys,
lists, strings, numbers, booleans, None and NumPy arrays, which travel as their raw bytes.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

_LENGTH = struct.Struct("!I")  # the JSON header's length, before it


def pack(value: Any) -> bytes:
    """`value` as bytes (`unpack` reads them back).

    >>> unpack(pack({"a": [1, "b", None], "x": np.arange(3, dtype="float32")}))["x"].tolist()
    [0.0, 1.0, 2.0]
    """
    arrays: list[np.ndarray] = []

    def plain(item: Any) -> Any:
        if isinstance(item, dict):
            return {"d": {str(key): plain(value) for key, value in item.items()}}
        if isinstance(item, (list, tuple)):
            return {"l": [plain(value) for value in item]}
        if isinstance(item, (np.ndarray, np.generic)):
            array = np.ascontiguousarray(item)
            arrays.append(array)
            return {"a": [len(arrays) - 1, array.dtype.str, list(array.shape)]}
        return {"v": item}

    header = json.dumps(plain(value)).encode()
    return b"".join([_LENGTH.pack(len(header)), header, *(array.tobytes() for array in arrays)])


def unpack(data: bytes) -> Any:
    (length,) = _LENGTH.unpack_from(data)
    header = json.loads(data[_LENGTH.size : _LENGTH.size + length])
    offset = _LENGTH.size + length
    found: dict[int, tuple[str, list[int]]] = {}

    def collect(item: dict) -> None:
        if "a" in item:
            index, dtype, shape = item["a"]
            found[index] = (dtype, shape)
        for value in item.get("d", {}).values():
            collect(value)
        for value in item.get("l", []):
            collect(value)

    collect(header)
    arrays = []
    for index in range(len(found)):
        dtype, shape = found[index]
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize
        arrays.append(np.frombuffer(data, dtype=dtype, count=int(np.prod(shape)), offset=offset).reshape(shape).copy())
        offset += size

    def value_of(item: dict) -> Any:
        if "d" in item:
            return {key: value_of(value) for key, value in item["d"].items()}
        if "l" in item:
            return [value_of(value) for value in item["l"]]
        if "a" in item:
            return arrays[item["a"][0]]
        return item["v"]

    return value_of(header)
