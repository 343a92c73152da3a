"""What a worker group kept for several runs (`cluster/shared_workers.py`) refuses, in one line; the runs on
it are the 2-worker runs against Keras `fit` (tests/test_keras_*.py, test_own_steps.py, test_callbacks.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_shared_workers_refuse_in_one_line_what_they_cannot_run_as_its_own_group():
    from rayparallel.cluster.run_state import ResumePoint
    from rayparallel.cluster.shared_workers import SharedWorkers
    from rayparallel.errors import RayParallelError
    from rayparallel.spec import load_spec
    from tests.models import lstm_job

    shared = SharedWorkers(2, "unused")
    assert shared.refusal(load_spec(lstm_job("shared"))) is None
    three = load_spec(lstm_job("shared", "scaling.num_workers=3"))
    assert shared.refusal(three) == "scaling.num_workers: expected 2 on shared workers, received 3"
    steps = load_spec(lstm_job("shared", "run.resume_every_n_steps=5"))
    assert shared.refusal(steps) == "run.resume_every_n_steps: expected None on shared workers, received 5"
    restarts = load_spec(lstm_job("shared", "failure.max_failures=2"))
    assert shared.refusal(restarts) == "failure.max_failures: expected 0 on shared workers, received 2"
    gpus = load_spec(lstm_job("shared", "scaling.use_gpu=true", 'scaling.resources_per_worker={"CPU": 2}'))
    assert shared.refusal(gpus) == "scaling.use_gpu: expected False on shared workers, received True"
    shaped = SharedWorkers.for_job(gpus, "unused")
    assert shaped.refusal(gpus) is None and shaped.described == "2 workers: a GPU each, {'CPU': 2} each"
    assert SharedWorkers(1, "unused").described == "1 worker"
    with pytest.raises(RayParallelError, match="^--resume: expected a fresh run on shared workers, received a resume"):
        shared.check(load_spec(lstm_job("shared")), ResumePoint(2, "epoch 2", Path("."), []))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"num_workers": 0}, "num_workers: expected a positive number, received 0"),
        ({"num_workers": "2"}, "num_workers: expected a positive number, received '2'"),
        ({"resources_per_worker": 2}, "resources_per_worker: expected a dict such as {'CPU': 2}, received 2"),
    ],
)
def test_workers_started_ahead_refuse_a_bad_shape_in_one_line_before_ray(arguments, message):
    import ray

    import rayparallel
    from rayparallel.errors import RayParallelError

    started = ray.is_initialized()
    with pytest.raises(RayParallelError) as info:
        rayparallel.Workers(**arguments)
    assert str(info.value) == message
    assert ray.is_initialized() == started  # refused before any Ray starts
