"""YAML text and `--set` overrides -> a validated :class:`JobSpec`.

Validation happens here, before Ray or TensorFlow start, so a typo costs a second and not a
cluster start-up. Every error names the key, what was expected and what was received.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import types
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from ..errors import SpecError, describe, first_line
from .references import check_picklable
from .schema import JobSpec

_POSITIVE = {
    "train.global_batch_size",
    "predict.batch_size",
    "train.epochs",
    "train.initial_loss_scale",
    "train.gradient_accumulation_steps",
    "train.steps_per_epoch",
    "train.validation_steps",
    "scaling.elastic_resize_monitor_interval_s",
    "run.collective_timeout_s",
    "run.checkpoints_to_keep",
    "mlflow.model_batch_size",
    "mlflow.flush_timeout_s",
    "tune.samples",
    "tune.max_concurrent",
    "tune.grace_period",
}
_NON_NEGATIVE = {
    "train.progress_every_n_steps",
    "failure.max_failures",
    "run.stall_warning_s",
    "mlflow.system_metrics_interval_s",
}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_ALIAS = re.compile(r"[A-Za-z0-9_-]{1,255}")


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader reading `1e-4` as the number YAML 1.2 (and every user) means, not a string."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def load_yaml(text: str) -> Any:
    """YAML as job files and `--set` values are read.

    >>> load_yaml("learning_rate: 1e-4")
    {'learning_rate': 0.0001}
    """
    return yaml.load(text, Loader=_Loader)


SpecSource = str | os.PathLike | dict | JobSpec  # a job: its YAML's path, the YAML as a dict, or a loaded spec


def load_spec(source: SpecSource, overrides: Iterable[str] = ()) -> JobSpec:
    """Read a job from a YAML path (or a dict), apply `key.path=value` overrides, validate.

    >>> spec = load_spec("jobs/stateful_lstm.yaml", overrides=["train.epochs=2"])  # doctest: +SKIP
    """
    if isinstance(source, JobSpec):
        raw = source.to_dict()
    elif isinstance(source, dict):
        raw = source
    else:
        raw = read_yaml(Path(source))
    raw = apply_overrides(raw, overrides)
    spec = _build(JobSpec, raw, "")
    _check_values(spec)
    return spec


def read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise SpecError(f"job file: expected an existing YAML file, received {str(path)!r} (not found)")
    try:
        raw = load_yaml(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or first_line(exc)
        raise SpecError(f"{path}:{where}: expected valid YAML, received a syntax error: {problem}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: expected a mapping of sections (name, model, data, ...), received {describe(raw)}")
    return raw


def apply_overrides(raw: dict, overrides: Iterable[str]) -> dict:
    """`train.epochs=3` sets raw["train"]["epochs"] = 3 (the value is parsed as YAML)."""
    import copy

    raw = copy.deepcopy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"--set: expected KEY.PATH=VALUE, received {item!r}")
        try:
            value = load_yaml(text)
        except yaml.YAMLError:
            raise SpecError(f"--set {key}: expected a YAML value, received {text!r}") from None
        node = raw
        parts = key.strip().split(".")
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                raise SpecError(f"--set {key}: expected {where} to be a section, received {describe(child)}")
            node = child
        node[parts[-1]] = value
    return raw


def _build(cls: type, raw: Any, path: str) -> Any:
    """Turn a dict into dataclass `cls`, checking keys and types recursively."""
    label = path or "job"
    if not isinstance(raw, dict):
        raise SpecError(f"{label}: expected a mapping, received {describe(raw)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key in raw:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f"; did you mean {_join(path, close[0])!r}?" if close else ""
            raise SpecError(f"{_join(path, key)}: unknown key; expected one of {sorted(fields)}{hint}")
    values = {}
    for name, f in fields.items():
        key_path = _join(path, name)
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SpecError(f"{key_path}: required key is missing")
            continue
        values[name] = _coerce(raw[name], hints[name], key_path)
    return cls(**values)


def _coerce(value: Any, hint: Any, path: str) -> Any:
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, path)
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        section_error = None  # a mapping meant for a section: its own error says more than the union's
        for option in typing.get_args(hint):
            try:
                return _coerce(value, option, path)
            except SpecError as exc:
                if isinstance(value, dict) and dataclasses.is_dataclass(option):
                    section_error = exc
        raise section_error or SpecError(f"{path}: expected {_type_name(hint)}, received {describe(value)}")
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            raise SpecError(f"{path}: expected one of {list(choices)}, received {describe(value)}")
        return value
    if hint is type(None):
        if value is not None:
            raise SpecError(f"{path}: expected null, received {describe(value)}")
        return None
    base = origin or hint
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if base is int and isinstance(value, bool):
        raise SpecError(f"{path}: expected an integer, received {describe(value)}")
    if base is Any or isinstance(value, base):
        return value
    raise SpecError(f"{path}: expected {_type_name(hint)}, received {describe(value)}")


def _check_values(spec: JobSpec) -> None:
    flat = {
        f"{section}.{name}": value
        for section in ("train", "scaling", "run", "mlflow", "failure", "tune", "predict")
        for name, value in vars(getattr(spec, section)).items()
    }
    for key in _POSITIVE:
        if flat[key] is not None and flat[key] <= 0:
            raise SpecError(f"{key}: expected a positive number, received {flat[key]!r}")
    for key in _NON_NEGATIVE:
        if flat[key] < 0:
            raise SpecError(f"{key}: expected zero or a positive number, received {flat[key]!r}")
    if spec.train.gradient_accumulation_steps > 1 and spec.train.loss_scale:
        raise SpecError(
            "train.gradient_accumulation_steps: expected 1 with train.dtype_policy mixed_float16 (its loss scaling "
            f"decides per batch), received {spec.train.gradient_accumulation_steps}"
        )
    if spec.tune.reduction_factor <= 1:
        raise SpecError(f"tune.reduction_factor: expected a number above 1, received {spec.tune.reduction_factor!r}")
    every = spec.run.resume_every_n_steps
    if every is not None and every < 1:
        raise SpecError(f"run.resume_every_n_steps: expected a positive number of steps or null, received {every!r}")
    if every is not None and not spec.run.local_storage:
        raise SpecError(
            "run.resume_every_n_steps: expected a run.storage_path on a local or mounted file system "
            f"(points inside epochs are written there), received {spec.run.storage_path!r}"
        )
    if not _NAME.fullmatch(spec.name):
        raise SpecError(
            "name: expected letters, digits, '.', '_' or '-' (it names the output folder and the Ray run), "
            f"received {spec.name!r}"
        )
    alias = spec.mlflow.register_alias
    if alias is not None and (not _ALIAS.fullmatch(str(alias)) or re.fullmatch(r"(?i)latest|v\d+", str(alias))):
        raise SpecError(
            "mlflow.register_alias: expected letters, digits, '_' or '-', not 'latest' or v<number> (MLflow's rule "
            f"for aliases) or null, received {alias!r}"
        )
    _check_workers(spec)
    _check_data(spec)
    refs = {"model.builder": spec.model.builder, "data.loader": spec.data.loader, "data.dataset": spec.data.dataset}
    refs.update({"data.val_dataset": spec.data.val_dataset, "data.predict_dataset": spec.data.predict_dataset})
    for key, ref in refs.items():
        if ref is None:
            continue
        if callable(ref):
            check_picklable(ref, key)
            continue
        module, sep, attr = ref.partition(":")
        if not (sep and module and attr):
            raise SpecError(f"{key}: expected 'module:function', received {ref!r}")
    _check_checkpoint(spec)
    for name, amount in spec.scaling.resources_per_worker.items():
        if not isinstance(amount, (int, float)) or isinstance(amount, bool) or amount < 0:
            raise SpecError(
                f"scaling.resources_per_worker.{name}: expected a non-negative number, received {describe(amount)}"
            )


def _check_data(spec: JobSpec) -> None:
    data = spec.data
    if (data.loader is None) == (data.dataset is None):
        got = "both" if data.loader else "neither"
        raise SpecError(f"data: expected either loader (in-memory arrays) or dataset (Ray Data), received {got}")
    if data.dataset is None:
        if data.val_dataset is not None:
            raise SpecError("data.val_dataset: expected it with data.dataset (Ray Data), received it with data.loader")
        return
    for key in ("x", "y"):
        value = getattr(data, key)
        names = value if isinstance(value, list) else [value]
        if not names or not all(isinstance(n, str) and n for n in names):
            raise SpecError(f"data.{key}: expected a column name or a list of them, received {describe(value)}")
    if spec.train.class_weight is not None:
        raise SpecError(
            "train.class_weight: expected it with data.loader (in-memory labels), received it with data.dataset; "
            "weigh the rows in the dataset instead"
        )
    uneven = [
        n for n in range(spec.scaling.min_workers, spec.scaling.max_workers + 1) if spec.train.global_batch_size % n
    ]
    if data.layout == "shuffle" and uneven:
        raise SpecError(
            f"scaling.num_workers: expected worker counts that divide train.global_batch_size="
            f"{spec.train.global_batch_size} with data.dataset and layout shuffle (Ray splits the rows evenly), "
            f"received {spec.scaling.described}"
        )


def _check_workers(spec: JobSpec) -> None:
    scaling, global_batch = spec.scaling, spec.train.global_batch_size
    key = "scaling.num_workers.max" if scaling.elastic else "scaling.num_workers"
    if scaling.elastic and scaling.min_workers < 1:
        raise SpecError(f"scaling.num_workers.min: expected at least 1 worker, received {scaling.min_workers!r}")
    if scaling.elastic and scaling.min_workers > scaling.max_workers:
        raise SpecError(
            f"scaling.num_workers: expected min <= max, received min {scaling.min_workers}, max {scaling.max_workers}"
        )
    if scaling.max_workers < 1:
        raise SpecError(f"{key}: expected a positive number, received {scaling.max_workers!r}")
    if scaling.max_workers > global_batch:
        raise SpecError(
            f"{key}: expected at most train.global_batch_size={global_batch} workers "
            f"(each worker needs at least one row of every batch), received {scaling.max_workers}"
        )
    if scaling.elastic and spec.failure.max_failures == 0:
        raise SpecError(
            "failure.max_failures: expected at least 1 with elastic scaling (a lost node is a failure the run "
            "restarts from), received 0"
        )


def _check_checkpoint(spec: JobSpec) -> None:
    ckpt = spec.checkpoint
    if not ckpt.filepath.endswith(".weights.h5"):
        raise SpecError(
            f"checkpoint.filepath: expected a name ending in '.weights.h5' (Keras weights), received {ckpt.filepath!r}"
        )
    if "/" in ckpt.filepath or "\\" in ckpt.filepath:
        raise SpecError(
            f"checkpoint.filepath: expected a file name (set checkpoint.dir for the folder), received {ckpt.filepath!r}"
        )
    if isinstance(ckpt.save_freq, int) and ckpt.save_freq <= 0:
        raise SpecError(
            f"checkpoint.save_freq: expected 'epoch' or a positive number of steps, received {ckpt.save_freq!r}"
        )
    if ckpt.keep is not None and ckpt.keep <= 0:
        raise SpecError(f"checkpoint.keep: expected a positive number of files or null, received {ckpt.keep!r}")


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _type_name(hint: Any) -> str:
    names = {
        int: "an integer",
        float: "a number",
        str: "a string",
        bool: "true or false",
        dict: "a mapping",
        list: "a list",
        type(None): "null",
        Callable: "a function",
    }
    if typing.get_origin(hint) in (Union, types.UnionType):
        return " or ".join(_type_name(h) for h in typing.get_args(hint))
    if typing.get_origin(hint) is Literal:
        return " or ".join(repr(choice) for choice in typing.get_args(hint))
    if dataclasses.is_dataclass(hint):
        return "{" + ", ".join(f"{f.name}: ..." for f in dataclasses.fields(hint)) + "}"
    return names.get(typing.get_origin(hint) or hint, getattr(hint, "__name__", str(hint)))
