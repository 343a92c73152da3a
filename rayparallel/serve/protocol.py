"""KServe's v2 inference protocol with Triton's sequence extension: what a request says, and the answer.

A request to `POST /v2/models/{name}/infer` holds `inputs` (each `name`, `shape`, `datatype`, `data`) and
`parameters` with `sequence_id` (an unsigned integer or a string), `sequence_start` and `sequence_end`. Its
tensors come as JSON lists or, with Triton's binary tensor extension (what `tritonclient` sends by
default), as raw bytes after the JSON header, whose length the `Inference-Header-Content-Length` header
gives. A window is one row: shape `[1, *window]`. Every refusal is a `ProtocolError`: a status and one
line, answered as KServe's `{"error": ...}`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# KServe v2 datatypes and NumPy's
DATATYPES = {
    "BOOL": "bool",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
}
NUMPY_DATATYPES = {np.dtype(numpy).name: kserve for kserve, numpy in DATATYPES.items()}
MAX_BODY_BYTES = 16 * 2**20  # a window is small: anything larger is refused before it is parsed


class ProtocolError(ValueError):
    """A request the server refuses: `status` (4xx, or 503) and one line."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status

    def body(self) -> dict:
        return {"error": str(self)}


@dataclass(frozen=True)
class TensorSpec:
    """One input or output as the model's metadata names it: per-window shape, KServe datatype."""

    name: str
    datatype: str
    shape: tuple[int, ...]  # one window's, without the leading row

    def metadata(self) -> dict:
        return {"name": self.name, "datatype": self.datatype, "shape": [-1, *self.shape]}


@dataclass
class InferRequest:
    sequence_id: int | str
    start: bool
    end: bool
    window: np.ndarray  # one window, the input's per-window shape
    request_id: str | None = None
    outputs: list[str] = field(default_factory=list)  # the names asked for; none: all


def parse_infer(body: bytes, header_length: int | None, model_input: TensorSpec) -> InferRequest:
    """The request `body` (JSON, or a JSON header of `header_length` bytes and binary tensors) checked
    against the model's one input; a `ProtocolError` for anything else."""
    if len(body) > MAX_BODY_BYTES:
        raise ProtocolError(413, f"body: expected at most {MAX_BODY_BYTES} bytes, received {len(body)}")
    header, binary = (body[:header_length], body[header_length:]) if header_length else (body, b"")
    try:
        request = json.loads(header)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(400, f"body: expected a JSON inference request, received invalid JSON ({exc})") from None
    if not isinstance(request, dict):
        raise ProtocolError(400, f"body: expected a JSON object, received {type(request).__name__}")
    parameters = request.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise ProtocolError(400, f"parameters: expected an object, received {type(parameters).__name__}")
    sequence_id = _sequence_id(parameters)
    start, end = (_flag(parameters, key) for key in ("sequence_start", "sequence_end"))
    window = _window(request.get("inputs"), binary, model_input)
    wanted = [o.get("name") for o in request.get("outputs") or [] if isinstance(o, dict)]
    request_id = request.get("id") if isinstance(request.get("id"), str) else None
    return InferRequest(sequence_id, start, end, window, request_id, wanted)


def infer_response(
    model: str, version: str, request: InferRequest, outputs: dict[str, np.ndarray], specs: list[TensorSpec]
) -> dict:
    """The answer to `request`: each output (asked for, else all) as one row, JSON data."""
    named = {spec.name: spec for spec in specs}
    chosen = request.outputs or list(outputs)
    unknown = [name for name in chosen if name not in outputs]
    if unknown:
        raise ProtocolError(400, f"outputs: expected names among {list(outputs)}, received {unknown}")
    answer = {
        "model_name": model,
        "model_version": version,
        "outputs": [
            {
                "name": name,
                "datatype": named[name].datatype,
                "shape": [1, *np.shape(outputs[name])],
                "data": np.asarray(outputs[name]).ravel().tolist(),
            }
            for name in chosen
        ],
        "parameters": {"sequence_id": request.sequence_id},
    }
    if request.request_id is not None:
        answer["id"] = request.request_id
    return answer


def tensor_spec(name: str, dtype: Any, shape: tuple) -> TensorSpec:
    """A Keras tensor's per-window spec in KServe's words."""
    kind = NUMPY_DATATYPES.get(np.dtype(str(dtype)).name)
    if kind is None:
        raise ValueError(f"model: expected numeric inputs and outputs, received {name!r} of dtype {dtype}")
    return TensorSpec(name, kind, tuple(int(d) for d in shape))


def _sequence_id(parameters: dict) -> int | str:
    value = parameters.get("sequence_id")
    if isinstance(value, bool) or value is None or value == 0 or value == "":
        raise ProtocolError(
            400, f"sequence_id: expected a non-zero unsigned integer or a non-empty string, received {value!r}"
        )
    if isinstance(value, int) and value > 0 or isinstance(value, str):
        return value
    raise ProtocolError(400, f"sequence_id: expected a non-zero unsigned integer or a string, received {value!r}")


def _flag(parameters: dict, key: str) -> bool:
    value = parameters.get(key, False)
    if not isinstance(value, bool):
        raise ProtocolError(400, f"{key}: expected true or false, received {value!r}")
    return value


def _window(inputs: Any, binary: bytes, spec: TensorSpec) -> np.ndarray:
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise ProtocolError(400, f"inputs: expected one input named {spec.name!r}, received {_described(inputs)}")
    given = inputs[0]
    if given.get("name") != spec.name:
        raise ProtocolError(400, f"inputs: expected the input {spec.name!r}, received {given.get('name')!r}")
    wanted = [1, *spec.shape]
    if given.get("shape") != wanted:
        raise ProtocolError(
            400, f"inputs[{spec.name!r}].shape: expected {wanted} (one window), received {given.get('shape')!r}"
        )
    if given.get("datatype") != spec.datatype:
        raise ProtocolError(
            400, f"inputs[{spec.name!r}].datatype: expected {spec.datatype!r}, received {given.get('datatype')!r}"
        )
    dtype = np.dtype(DATATYPES[spec.datatype])
    size = int(np.prod(wanted))
    binary_size = (given.get("parameters") or {}).get("binary_data_size")
    if binary_size is not None:
        if binary_size != size * dtype.itemsize or len(binary) < binary_size:
            raise ProtocolError(
                400, f"inputs[{spec.name!r}]: expected {size * dtype.itemsize} binary bytes, received {len(binary)}"
            )
        return np.frombuffer(binary[:binary_size], dtype=dtype).reshape(spec.shape).copy()
    data = given.get("data")
    try:
        values = np.asarray(data, dtype=dtype)
    except (TypeError, ValueError):
        raise ProtocolError(
            400, f"inputs[{spec.name!r}].data: expected {size} numbers, received {_described(data)}"
        ) from None
    if values.size != size:
        raise ProtocolError(400, f"inputs[{spec.name!r}].data: expected {size} numbers, received {values.size}")
    return values.reshape(spec.shape)


def _described(value: Any) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."
