"""Every Ray, TensorFlow and Keras internal rayparallel relies on still exists on the pinned versions."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import numpy as np
import pytest

from rayparallel.hooks import (
    BATCH_NORM_ATTRIBUTES,
    ENV_DEFAULTS,
    HOOKS,
    LOSS_ATTRIBUTES,
    LOSS_MODULE_ATTRIBUTES,
    MODEL_ATTRIBUTES,
    OPTIMIZER_ATTRIBUTES,
    STDLIB_PRIVATE,
    env_defaults,
    hook,
)

from .helpers import REPO


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_every_hook_resolves(name):
    assert hook(name) is not None


def test_the_replaced_optimizer_attributes_exist_on_a_keras_optimizer():
    import keras

    optimizer = keras.optimizers.SGD(0.1)
    missing = [name for name in OPTIMIZER_ATTRIBUTES if not hasattr(optimizer, name)]
    assert not missing, f"keras {keras.__version__} optimizers lack {missing}"


def test_the_model_and_loss_attributes_read_or_replaced_exist():
    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    loss = keras.losses.Huber(delta=0.5)
    model.compile(loss=loss)
    missing = [name for name in MODEL_ATTRIBUTES if not hasattr(model, name)]
    missing += [name for name in LOSS_MODULE_ATTRIBUTES if not hasattr(hook("keras_losses"), name)]
    assert not missing, f"keras {keras.__version__} lacks {missing}"
    assert model._compile_config.config["loss"] is loss  # the live object: Huber's get_config drops its delta
    missing = [name for name in LOSS_ATTRIBUTES if not hasattr(loss, name)]
    batch_norm = keras.layers.BatchNormalization()
    batch_norm.build((None, 3))
    missing += [name for name in BATCH_NORM_ATTRIBUTES if not hasattr(batch_norm, name)]
    assert not missing, f"keras {keras.__version__} lacks {missing}"


PACKAGE = REPO / "rayparallel"
THIRD_PARTY = ("ray", "tensorflow", "keras", "mlflow")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _on_self(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")


def _names_defined_here(trees: dict) -> set[str]:
    """Functions, classes, arguments, variables and `self.` attributes rayparallel defines itself."""
    own = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _on_self(node):
                own.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, ast.arg):
                own.add(node.arg)
    return own


def _run_time_imports(tree: ast.Module) -> list[ast.AST]:
    """Import statements outside `if TYPE_CHECKING:` blocks (those never run)."""
    checking = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
        for inner in ast.walk(node)
    }
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in checking]


def test_every_private_name_of_ray_tensorflow_or_keras_the_code_touches_is_listed_in_hooks():
    """An attribute `obj._name` read or replaced on anything but rayparallel's own objects, and an import of a
    private module, are named in `rayparallel/hooks.py` (so the checks above cover them), or it is one of
    the standard library's few."""
    trees = {path: ast.parse(path.read_text()) for path in PACKAGE.rglob("*.py")}
    own = _names_defined_here(trees)
    listed = set(OPTIMIZER_ATTRIBUTES + MODEL_ATTRIBUTES + BATCH_NORM_ATTRIBUTES + LOSS_ATTRIBUTES)
    listed |= set(LOSS_MODULE_ATTRIBUTES + STDLIB_PRIVATE)
    listed |= {part for target in HOOKS.values() for part in target.replace(":", ".").split(".")}
    unlisted, private_imports = set(), []
    for path, tree in trees.items():
        where = path.relative_to(REPO)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) and not _on_self(node):
                if node.attr not in own | listed:
                    unlisted.add(f"{where}:{node.lineno} .{node.attr}")
        if path.name == "hooks.py":
            continue
        for node in _run_time_imports(tree):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in modules:
                parts = module.split(".")
                if parts[0] in THIRD_PARTY and (any(_private(p) for p in parts) or module.startswith("keras.src")):
                    private_imports.append(f"{where}:{node.lineno} {module}")
    assert not unlisted, f"private attributes not listed in rayparallel/hooks.py: {sorted(unlisted)}"
    assert not private_imports, f"private modules imported outside rayparallel/hooks.py: {private_imports}"


def test_importing_rayparallel_sets_no_environment_variable():
    probe = (
        "import os, json; before = dict(os.environ); "
        "import rayparallel, rayparallel.cli, rayparallel.cluster.run, rayparallel.cluster.launch, "
        "rayparallel.tuning.driver, rayparallel.tracking.mlflow_run, rayparallel.worker.loop; "
        "print(json.dumps(sorted(set(os.environ.items()) ^ set(before.items()))))"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_driver_defaults_last_only_while_the_block_runs(monkeypatch):
    key = next(iter(ENV_DEFAULTS["train_driver"]))
    monkeypatch.delenv(key, raising=False)
    with env_defaults("train_driver"):
        assert os.environ[key] == ENV_DEFAULTS["train_driver"][key]
    assert key not in os.environ
    monkeypatch.setenv(key, "7")  # a user's own setting wins, and stays
    with env_defaults("train_driver"):
        assert os.environ[key] == "7"
    assert os.environ[key] == "7"


def test_the_trainer_keeps_ray_trains_callbacks_but_the_cleaner_and_without_datasets_the_data_one(tmp_path):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    from rayparallel.cluster.backend import TensorflowBackendConfig, trainer_class

    options = dict(
        scaling_config=ScalingConfig(num_workers=1), run_config=RunConfig(name="x", storage_path=str(tmp_path))
    )
    # a dataset as a function that makes it (Ray Train's own form): no Ray needed to build the trainer
    for datasets, left_out in (
        ({}, ("placement_group_cleaner", "datasets_callback")),
        ({"train": lambda: None}, ("placement_group_cleaner",)),
    ):
        ours = trainer_class()(lambda: None, backend_config=TensorflowBackendConfig(), datasets=datasets, **options)
        ray_own = DataParallelTrainer(
            lambda: None, backend_config=TensorflowBackendConfig(), datasets=datasets, **options
        )
        kept = [type(c).__name__ for c in ours._create_default_callbacks()]
        unneeded = tuple(hook(name) for name in left_out)
        assert kept == [type(c).__name__ for c in ray_own._create_default_callbacks() if not isinstance(c, unneeded)]
        assert "BackendSetupCallback" in kept and "PlacementGroupCleanerCallback" not in kept
        assert ("DatasetsCallback" in kept) == bool(datasets)


def test_keras_loss_scaling_is_off_only_while_a_step_is_traced():
    """Every step runs Keras' losses without the 1/replicas scaling, and only inside the block, on the thread
    that traces it (each local replica traces in its own): a later run in the same process (or the driver's
    checks) gets Keras' own. The loss trackers' values are scaled by global batch / (workers x rows): 1 with
    even shards, so summed states give the global mean."""
    import tensorflow as tf

    from rayparallel.worker.loss_reduction import global_batch_losses

    from .test_step_replicas import two_replicas

    losses, strategy = hook("keras_losses"), two_replicas()

    def scaled():
        return losses.scale_loss_for_distribution(tf.constant(3.0))

    def traced():
        with global_batch_losses(8, 4, 2):
            return scaled(), losses.unscale_loss_for_distribution(tf.constant(3.0))

    def on_replicas(function):
        return [float(v) for v in tf.nest.flatten(strategy.experimental_local_results(strategy.run(function)))]

    assert on_replicas(scaled) == [1.5, 1.5]  # Keras' own: 1/replicas
    assert on_replicas(traced) == [3.0, 3.0, 3.0, 3.0]  # each replica: (scale, unscale) unchanged
    with global_batch_losses(7, 3, 2):  # rows 4 and 3: the 3-row worker's loss counts 7/6 per row
        assert float(losses.unscale_loss_for_distribution(np.float32(6.0))) == pytest.approx(7.0)
    assert on_replicas(scaled) == [1.5, 1.5]  # Keras' own again
