"""Every Ray, TensorFlow and Keras internal rayparallel relies on still exists on the pinned versions."""

from __future__ import annotations

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
    """Every step runs Keras' losses without the 1/replicas scaling, and only inside the block: a later run in
    the same process (or the driver's checks) gets Keras' own functions back. The loss trackers' values are
    scaled by global batch / (workers x rows): 1 with even shards, so summed states give the global mean."""
    from rayparallel.worker.loss_reduction import global_batch_losses

    losses = hook("keras_losses")
    keras_own = losses.scale_loss_for_distribution, losses.unscale_loss_for_distribution
    with global_batch_losses(8, 4, 2):
        assert (losses.scale_loss_for_distribution(3.0), losses.unscale_loss_for_distribution(3.0)) == (3.0, 3.0)
        assert losses.scale_loss_for_distribution is not keras_own[0]
    with global_batch_losses(7, 3, 2):  # rows 4 and 3: the 3-row worker's loss counts 7/6 per row
        assert float(losses.unscale_loss_for_distribution(np.float32(6.0))) == pytest.approx(7.0)
    assert (losses.scale_loss_for_distribution, losses.unscale_loss_for_distribution) == keras_own
