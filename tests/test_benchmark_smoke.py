"""Benchmarks that cannot rot: each one starts, and every call it makes into rayparallel, jobs or another
benchmark fits the callee's signature (a removed keyword once broke `benchmarks.run --quick` after
3 minutes of measuring). Fast: nothing is measured here; `python -m benchmarks.<name> --quick` does that.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import runpy
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
OURS = ("rayparallel", "benchmarks", "jobs")  # the code a benchmark can fall out of step with
COMMANDS = sorted(p.stem for p in BENCHMARKS.glob("*.py") if "def main(" in p.read_text())
MODULES = sorted(p.stem for p in BENCHMARKS.glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", COMMANDS)
def test_every_benchmark_command_starts(name, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [f"benchmarks.{name}", "--help"])
    monkeypatch.delitem(sys.modules, f"benchmarks.{name}", raising=False)  # imported by another: run it afresh
    with pytest.raises(SystemExit) as exited:
        runpy.run_module(f"benchmarks.{name}", run_name="__main__")
    assert exited.value.code == 0
    assert "usage:" in capsys.readouterr().out


def imported_names(tree: ast.Module, module: str) -> dict[str, str]:
    """Local name -> 'module:attribute' (or 'module:' for a module) for every import of our code, anywhere."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:  # relative: from inside benchmarks/
                source = importlib.util.resolve_name("." * node.level + source, "benchmarks")
            if source.split(".")[0] in OURS:
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{source}:{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OURS:
                    names[alias.asname or alias.name.split(".")[0]] = f"{alias.name.split('.')[0]}:"
    names.update({n.name: f"benchmarks.{module}:{n.name}" for n in tree.body if isinstance(n, ast.FunctionDef)})
    return names


def resolve(target: str, attributes: list[str]):
    """The object `module:attribute` then `.attributes` names, importing submodules on the way; None if none."""
    module, _, attribute = target.partition(":")
    found = importlib.import_module(module)
    for name in ([attribute] if attribute else []) + attributes:
        if hasattr(found, name):
            found = getattr(found, name)
        elif inspect.ismodule(found):
            try:
                found = importlib.import_module(f"{found.__name__}.{name}")
            except ImportError:
                return None
        else:
            return None
    return found


def calls_into_our_code(module: str):
    """(line, dotted name, callee, call node) for every call whose callee resolves into our code."""
    tree = ast.parse((BENCHMARKS / f"{module}.py").read_text())
    names = imported_names(tree, module)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        chain, func = [], node.func
        while isinstance(func, ast.Attribute):
            chain.insert(0, func.attr)
            func = func.value
        if not isinstance(func, ast.Name) or func.id not in names:
            continue
        callee = resolve(names[func.id], chain)
        if callable(callee):
            yield node.lineno, ".".join([func.id, *chain]), callee, node


@pytest.mark.parametrize("module", MODULES)
def test_every_call_a_benchmark_makes_into_our_code_fits_its_signature(module):
    checked, wrong = 0, []
    for line, name, callee, call in calls_into_our_code(module):
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            continue  # *args / **kwargs: their names are not known here
        try:
            signature = inspect.signature(callee)
        except (TypeError, ValueError):  # a builtin or a Ray actor class: nothing to bind against
            continue
        try:
            signature.bind(*call.args, **{k.arg: k.value for k in call.keywords})
        except TypeError as exc:
            wrong.append(f"benchmarks/{module}.py:{line}: {name}(...): {exc}")
        checked += 1
    assert not wrong, "\n".join(wrong)
    print(f"benchmarks/{module}.py: {checked} calls into rayparallel/jobs/benchmarks fit their signatures")
