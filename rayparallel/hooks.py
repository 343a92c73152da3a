"""Every private Ray, TensorFlow and Keras internal rayparallel relies on, and every environment default it sets.

The pinned versions are the ones these were read in. A version bump may move any of them
without notice, so each is named here once, imported only when first used (importing
rayparallel changes nothing), and `tests/test_hooks.py` checks that every one still exists:
a bump that moves one fails in the fast tests, not in the middle of a run.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator
from typing import Any

# name -> "module" or "module:attribute.path", and why there is no public way
HOOKS = {
    # the controller's callback interface: how its handle reaches the driver (cluster/abort.py)
    "controller_callback": "ray.train.v2._internal.execution.callback:ControllerCallback",
    # Tune's function trainable, subclassed so a trial's stop waits for its run (tuning/trial.py)
    "wrap_function": "ray.tune.trainable.function_trainable:wrap_function",
    # the driver's stream of worker output: no public switch once ray.init() ran
    "ray_logging": "ray._private.ray_logging",
    # what Ray Train's state export records for our own TensorFlow backend
    "training_framework": "ray.train.v2._internal.util:TrainingFramework",
    # a worker's address for TF_CONFIG, as Ray's own TensorFlow backend finds it
    "build_address": "ray._common.network_utils:build_address",
    "address_and_port": "ray.train._internal.utils:get_address_and_port",
    # Ray Train's placement-group cleaner, left out of the trainer's callbacks (cluster/backend.py)
    "placement_group_cleaner": "ray.train.v2._internal.callbacks.placement_group_callback:PlacementGroupCleanerCallback",
    # Ray Train's autoscaling coordinator, started before the controller asks for it (cluster/connect.py)
    "autoscaling_coordinator": (
        "ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator:get_or_create_autoscaling_coordinator"
    ),
    # whether a joined cluster may grow (cluster/connect.py): the autoscaler's version and the status
    # its monitor keeps in the GCS (what `ray status` prints); Ray has no public "is autoscaling"
    "is_autoscaler_v2": "ray.autoscaler.v2.utils:is_autoscaler_v2",
    "autoscaling_status_key": "ray._private.ray_constants:DEBUG_AUTOSCALING_STATUS",
    "internal_kv_get": "ray.experimental.internal_kv:_internal_kv_get",
    # Ray Train's Ray Data callback, left out of a trainer without datasets (cluster/backend.py)
    "datasets_callback": "ray.train.v2._internal.callbacks.datasets:DatasetsCallback",
    "trainer_default_callbacks": "ray.train.v2.api.data_parallel_trainer:DataParallelTrainer._create_default_callbacks",
    # a Tune trial's session: its cleanup must wait for the run to end
    "train_session": "ray.train._internal.session:get_session",
    # the step watchdog frees collectives that wait for a dead peer
    "tf_context": "tensorflow.python.eager.context:context",
    "tf_errors": "tensorflow.python.framework.errors",
    # a worker's own (unmirrored) RNN state variables inside the strategy's scope
    "default_variable_creator": "tensorflow.python.ops.resource_variable_ops:default_variable_creator_v2",
    # loss scaling: whether a cond may hold the optimizer's update in replica context
    "no_merge_call": "tensorflow:__internal__.distribute.strategy_supports_no_merge_call",
    # every step: Keras' per-replica loss scaling off, its loss reduction with global divisors, its mask
    # merge and rank matching (worker/loss_reduction.py)
    "keras_losses": "keras.src.losses.loss",
    "keras_apply_mask": "keras.src.losses.loss:apply_mask",
    "keras_same_rank": "keras.src.losses.loss:squeeze_or_expand_to_same_rank",
    # `fit(validation_split=...)`'s split of arrays, which `rayparallel.fit` makes as fit makes it
    "keras_train_validation_split": "keras.src.trainers.data_adapters.array_slicing:train_validation_split",
    # serve: Ray Serve's request router keyed on the session id (experimental), by its dotted path
    "consistent_hash_router": "ray.serve.experimental.consistent_hash_router:ConsistentHashRouter",
    # a loss function wrapped as compile wraps it (keras.losses exports no such class)
    "keras_loss_function_wrapper": "keras.src.losses.losses:LossFunctionWrapper",
}

# Keras 3 optimizer attributes replaced: the all-reduce (compression; clipping after the sum)
# and the learning rate (a schedule fed the batch count under gradient accumulation).
OPTIMIZER_ATTRIBUTES = ("_all_reduce_sum_gradients", "_clip_gradients", "_learning_rate")
# Keras 3 model and loss-module attributes read or replaced: the settings a builder's compile gave
# (live objects; get_compile_config drops some, e.g. Huber's delta), Keras' own build of compile's
# metrics before every step is traced, the loss `compute_loss` computes without its tracker (our
# step's), the loss scaling every step runs without, and the loss reduction it makes global.
MODEL_ATTRIBUTES = ("_compile_config", "_symbolic_build", "_flatten_layers", "_compute_loss")  # every nested layer
# Ray's loggers that narrate a job's packaging (`rayparallel submit` holds them back without --verbose)
RAY_PACKAGING_LOGGERS = (
    "ray.dashboard.modules.dashboard_sdk",
    "ray.dashboard.modules.job.sdk",
    "ray._private.runtime_env.packaging",
    "ray._private.runtime_env.working_dir",
)
# The standard library's own private names the code uses (argparse's subparsers type, os._exit)
STDLIB_PRIVATE = ("_SubParsersAction", "_exit")
# BatchNormalization's moments, replaced by the global batch's (worker/batch_norm.py), and a wrapped
# loss's arguments, which its config may drop (worker/compile_settings.py)
BATCH_NORM_ATTRIBUTES = ("_moments", "_reduction_axes")
LOSS_ATTRIBUTES = ("_fn_kwargs",)
LOSS_MODULE_ATTRIBUTES = ("scale_loss_for_distribution", "unscale_loss_for_distribution", "reduce_weighted_values")

# Environment defaults, by the process that reads them; a user's own setting always wins.
ENV_DEFAULTS = {
    # read by Ray Train's controller, which the driver's environment reaches
    "train_driver": {
        # the controller polls its workers this often (default 2 s) and each epoch's report waits
        # for a poll: with the default every epoch of the default job lasted at least 2 s
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25",
        # its watcher (one more actor process per run, started beside the workers' TensorFlow
        # import) only tells `ray.train.get_preemption_info`, which rayparallel never reads
        "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    },
    "elastic_driver": {
        # after a lost node Ray still counts it for a while; the controller waits this long for a
        # worker group that cannot be placed (60 s by default) before it tries fewer workers
        "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "20",
    },
    "tune_driver": {
        "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",  # our files are the record
        "TUNE_DISABLE_SIGINT_HANDLER": "1",  # Ctrl-C ends trials as an interrupted run does
        "RAY_AIR_NEW_OUTPUT": "0",  # its reporter honours verbose=0: our console shows progress
    },
    "mlflow": {  # fail fast inside MLflow's HTTP client: retries are ours, without blocking training
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    },
    "ray_data": {
        # Ray's parquet reader lists files on this many new actors each execution (default 32:
        # 1-3 s per worker per epoch on a small node)
        "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS": "1",
    },
    "tensorflow": {"TF_CPP_MIN_LOG_LEVEL": "2"},
}


def hook(name: str) -> Any:
    """The module or attribute `HOOKS[name]` names, imported now."""
    module, _, path = HOOKS[name].partition(":")
    found = importlib.import_module(module)
    for attribute in path.split(".") if path else []:
        found = getattr(found, attribute)
    return found


def set_env_defaults(group: str) -> None:
    """For rayparallel's own processes (workers, the recorder): the group's defaults, kept."""
    for key, value in ENV_DEFAULTS[group].items():
        os.environ.setdefault(key, value)


@contextlib.contextmanager
def env_defaults(*groups: str) -> Iterator[None]:
    """In the user's own process (the driver): the groups' defaults while the block runs, then as before."""
    added = [key for group in groups for key in ENV_DEFAULTS[group] if key not in os.environ]
    for group in groups:
        set_env_defaults(group)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)
