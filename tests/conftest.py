"""Shared fixtures: one real local Ray for the whole session, shut down by the fixture itself;
a temporary MLflow store; real `mlflow server`s. Helpers live in `tests/helpers.py`."""

from __future__ import annotations

import os

import pytest

from .helpers import REPO, SESSION_CPUS, DefaultJobRuns, MlflowServer

SHARED: list = []  # the session's shared workers, once a test asked for them


def pytest_configure(config):
    """Two logical CPU devices in this process, made before TensorFlow starts its runtime (it cannot split
    the CPU later): `test_step_replicas` runs the step on a 2-replica MirroredStrategy over them. Ops
    stay on the first, as before; Ray's workers are processes of their own."""
    import tensorflow as tf

    # each test's runs start and end their own worker groups (the notebook test turns warm workers on in its
    # kernel): a group kept warm by one test would hold CPUs that the next test's runs need
    os.environ["RAYPARALLEL_WARM_WORKERS"] = "0"
    (cpu,) = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)


@pytest.fixture(scope="session", autouse=True)
def tracking_store(tmp_path_factory):
    """Runs that name no tracking URI log here, never into the clone's own `mlflow.db`."""
    previous = os.environ.get("MLFLOW_TRACKING_URI")
    uri = f"sqlite:///{tmp_path_factory.mktemp('tracking')}/mlflow.db"
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        yield uri
    finally:
        if previous is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = previous


@pytest.fixture(scope="session")
def ray_address():
    """A local Ray started by this test session (4 logical CPUs so 3 workers fit on 2 cores)."""
    import ray

    os.chdir(REPO)
    ray.init(
        address="local",
        num_cpus=SESSION_CPUS,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"TF_CPP_MIN_LOG_LEVEL": "2"}},
    )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def shared_workers(ray_address, tmp_path_factory):
    """Two workers kept up for 2-worker runs (`rayparallel/cluster/shared_workers.py`, `helpers.train_shared`):
    a short run's new processes and their imports are most of its time. The modules that use them run in
    one block (`pytest_collection_modifyitems`); a module after it gets their CPUs back
    (`_shared_workers_closed_elsewhere`)."""
    from rayparallel.cluster.shared_workers import SharedWorkers

    # half a CPU each: they idle while another test's run trains (tests run one at a time), so a 3-worker
    # run fits beside them on the session's 4 CPUs
    workers = SharedWorkers(2, str(tmp_path_factory.mktemp("shared-workers")), held_per_worker={"CPU": 0.5})
    SHARED.append(workers)
    try:
        yield workers
    finally:
        workers.close()


def pytest_collection_modifyitems(session, config, items):
    """The modules whose tests use the shared workers run one after another, where the first of them would
    run: one worker group for all of them instead of one started again after every other module."""
    shared = [item for item in items if "shared_workers" in item.fixturenames]
    if not shared:
        return
    modules = {item.path for item in shared}
    block = [item for item in items if item.path in modules]
    start = next(i for i, item in enumerate(items) if item.path in modules)
    rest = [item for item in items if item.path not in modules]
    items[:] = rest[:start] + block + rest[start:]


@pytest.fixture(scope="module", autouse=True)
def _shared_workers_closed_elsewhere(request):
    """First of a module's fixtures: a module whose tests do not use the shared workers gets their CPUs
    (they start again when a later test uses them)."""
    uses = any("shared_workers" in item.fixturenames for item in request.session.items if item.module is request.module)
    if SHARED and not uses:
        SHARED[0].close()


@pytest.fixture(scope="session")
def default_job_runs(ray_address, tmp_path_factory):
    return DefaultJobRuns(tmp_path_factory.mktemp("default-job"), ray_address)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """One real `mlflow server` for the session (each start migrates a new sqlite store: about 15 s);
    tests keep apart by experiment and registered-model names of their own."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow"))
    try:
        yield server
    finally:
        server.stop()
