"""The package's folders follow the data's path and nothing imports upward (pure logic: reads source)."""

from __future__ import annotations

import ast

from .helpers import REPO

PACKAGE = REPO / "rayparallel"
# A module may import its own floor and those below it, never a floor above.
FLOORS = {
    "errors": 0,
    "secrets": 0,
    "files": 0,
    "quiet": 0,
    "result": 0,
    "version": 0,
    "startup": 0,
    "logs": 0,  # the keys rayparallel adds to Keras' epoch logs
    "console": 0,
    "hooks": 0,  # version-sensitive names of Ray, TF and Keras internals, resolved on use
    "spec": 0,
    "model": 1,  # the base model: used by workers, the recorder and export alike
    "tracking": 2,
    "checkpoint": 3,
    "recorder": 4,
    "data": 5,  # what a worker trains on: arrays, Ray Data, Keras datasets (run in workers, the driver, actors)
    "worker": 6,
    "cluster": 7,
    "tuning": 8,  # many runs, each the one run path of cluster/run.py, scheduled by Ray Tune
    "inference": 8,  # `predict`: trained weights over the job's rows, on tasks or Ray Data replicas
    "serve": 8,  # `serve`: live streams, each in a slot of a replica, on inference's and training's parts
    "api": 9,
    "cli": 9,
    "__init__": 9,
}


def part_of(module: str) -> str:
    """'rayparallel.checkpoint.writer' -> 'checkpoint'; 'rayparallel' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FLOORS else "__init__"  # else a name from __init__


def imports(path) -> set[str]:
    """The rayparallel modules a file imports, at any depth (top level, in functions, TYPE_CHECKING)."""
    module = ".".join(path.relative_to(REPO).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    package = package.removesuffix(".__init__")
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [target] if node.module else [f"{target}.{alias.name}" for alias in node.names]
            found.update(name for name in names if name.startswith("rayparallel"))
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("rayparallel"))
    return found


def test_every_package_folder_has_an_init():
    for folder in [p for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__"]:
        assert (folder / "__init__.py").is_file(), folder


def test_nothing_imports_upward():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = path.relative_to(PACKAGE).with_suffix("").parts[0]
        assert own in FLOORS, f"{path}: give its folder or module a floor in FLOORS"
        for target in imports(path):
            if FLOORS[part_of(target)] > FLOORS[own]:
                upward.append(f"{path.relative_to(REPO)} imports {target}")
    assert not upward, upward


def test_checkpoint_code_imports_no_worker_code():
    for path in (PACKAGE / "checkpoint").glob("*.py"):
        assert not [t for t in imports(path) if part_of(t) == "worker"], path


def test_no_two_parts_import_each_other():
    """Floors alone let two parts of one floor import each other; the part graph has no cycle at all."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        own = path.relative_to(PACKAGE).with_suffix("").parts[0]
        graph.setdefault(own, set()).update(part_of(t) for t in imports(path) if part_of(t) != own)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph.get(start, ()))

    cycles = sorted(part for part in graph if reaches(part, part, set()))
    assert not cycles, f"parts in an import cycle: {cycles}"


def test_no_long_functions():
    """Every function short enough to read as one step (a long one is phases waiting for their names)."""
    long = [
        f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})"
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= 60
    ]
    assert not long, long
