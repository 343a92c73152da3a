"""A stream's state kept outside the replicas (`rayparallel/serve/kept_states.py`): the keeper's verdicts, and two
stream replicas sharing one keeper, in one event loop without Ray Serve, moved between as a replica's death or
the ring moves a stream: every answer is the batch-1 loop's, and a retried window is applied once.
(`tests/test_serve.py` kills a real replica with SIGKILL.)"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from rayparallel.errors import RayParallelError
from rayparallel.serve.kept_states import Commit, KeptStates, StateKeeper
from rayparallel.serve.replica import StreamReplica

from .test_serve_slots import Clock, batch_1_loop


def commit(stream, token, after, start=False, end=False) -> Commit:
    return Commit(stream, token, after, start, end, answer={"token": token}, state=[np.full(2, after)])


def test_the_keeper_keeps_counts_refuses_a_stale_slot_and_answers_a_retry_once():
    clock = Clock()
    keeper = KeptStates(idle_timeout_s=5.0, clock=clock)
    assert [v for v, _ in keeper.commit([commit("a", "a1", 0, start=True), commit("b", "b1", 0)])] == ["kept", "stale"]
    assert [v for v, _ in keeper.commit([commit("a", "a2", 1)])] == ["kept"]
    verdict, kept = keeper.commit([commit("a", "a2", 1)])[0]  # the same window again: its first answer
    assert verdict == "duplicate" and kept.answer == {"token": "a2"} and kept.windows == 2
    verdict, kept = keeper.commit([commit("a", "a3", 1)])[0]  # a slot one window behind
    assert verdict == "stale" and kept.windows == 2 and kept.state[0].tolist() == [1, 1]
    assert keeper.commit([commit("a", "a3", 2, end=True)])[0][0] == "kept" and keeper.recall("a").ended
    assert keeper.commit([commit("a", "a4", 3)])[0][0] == "stale"  # ended: only a start goes on
    assert keeper.commit([commit("a", "a4", 3, start=True)])[0][1].windows == 1
    clock.now = 5.5  # idle past the timeout: forgotten, as its slot is freed
    assert keeper.recall("a") is None and keeper.commit([commit("a", "a5", 1)])[0] == ("stale", None)


class InProcess:
    """A deployment handle's calling convention (`handle.method.remote(...)`, awaited) over the real keeper."""

    def __init__(self, target):
        self.target = target

    def __getattr__(self, name: str):
        return SimpleNamespace(remote=getattr(self.target, name))


def test_a_stream_moved_between_replicas_goes_on_from_its_kept_state_and_a_retry_is_applied_once():
    from jobs.stateful_lstm import build_model
    from rayparallel.spec import load_spec

    recipe = load_spec("jobs/stateful_lstm.yaml", []).model
    weights = build_model(1).get_weights()
    windows = list(np.random.default_rng(4).normal(size=(8, 8, 2)).astype("float32"))
    expected = batch_1_loop(weights, windows)

    async def scenario() -> list[tuple[int, np.ndarray]]:
        keeper = InProcess(StateKeeper(idle_timeout_s=60.0))
        a, b = (StreamReplica(recipe, weights, ["."], 3, 60.0, 1.0, keeper) for _ in range(2))
        sends = [(a, 0, "t0"), (a, 1, "t1"), (a, 2, "t2")]  # on a
        sends += [(b, 3, "t3"), (b, 3, "t3"), (b, 4, "t4")]  # a died: on b, from the kept state; a retry of 3
        sends += [(a, 5, "t5")]  # back on a, whose slot is 3 windows behind: stale, stepped again from the kept
        sends += [(b, 5, "t5"), (b, 6, "t6"), (b, 7, "t7")]  # 5 retried on b, which holds the stream: its kept answer
        answers = []
        for replica, t, token in sends:
            status, outputs, _ = await replica.infer("s", t == 0, t == 7, windows[t], token)
            answers.append((t, outputs["change"] if status == 200 else outputs))
        status, message, _ = await b.infer("s", False, False, windows[0], "t8")  # ended with window 7
        answers.append((status, message))
        return answers

    answers = asyncio.run(scenario())
    for t, change in answers[:-1]:
        assert np.abs(change - expected[t]).max() < 1e-5, t
    assert answers[-1][0] == 400 and answers[-1][1].startswith("sequence_start: expected true")


@pytest.mark.parametrize(
    "arguments, expected",
    [
        ({"weights": "w.weights.h5", "model": "models:/m@champion"}, "--weights, --model: expected one of them, "),
        ({}, "--weights, --model: expected one of them, received neither"),
        ({"model": "runs/x"}, "--model: expected models:/NAME@ALIAS or models:/NAME/VERSION, received 'runs/x'"),
        ({"model": "models:/m", "replicas": 0}, "--replicas: expected a positive integer, received 0"),
        ({"model": "models:/m@a", "keep_states": "no"}, "keep_states: expected True or False, received 'no'"),
        ({"model": "models:/m@a", "port": 70000}, "--port: expected a port number (1-65535), received 70000"),
    ],
    ids=["both", "neither", "uri", "replicas", "keep_states", "port"],
)
def test_a_bad_serve_argument_is_one_line_before_anything_starts(arguments, expected):
    import rayparallel

    with pytest.raises(RayParallelError) as info:
        rayparallel.serve("jobs/stateful_lstm.yaml", **arguments)
    assert str(info.value).startswith(expected) and "\n" not in str(info.value), str(info.value)


def test_a_window_that_waited_for_its_next_replica_is_not_counted_idle():
    """A failover slower than the idle timeout (10 s in CI's test, 9.7 s to rebuild the ring) loses no stream: the
    window's wait since it reached the front (up to the grace) is not the stream's idling; a stream that sent
    nothing for longer than the timeout is still forgotten."""
    clock = Clock()
    keeper = KeptStates(idle_timeout_s=10.0, clock=clock, grace_s=120.0)
    keeper.commit([commit("moved", "m1", 0, start=True), commit("quiet", "q1", 0, start=True)])
    clock.now = 2.0  # the next window reaches the front; its replica dies with it
    clock.now = 13.0  # another stream's call sweeps meanwhile: the waiting one is not dropped
    assert keeper.recall("other") is None
    kept = keeper.recall("moved", waited_s=11.0)  # its next replica recalls it, 11 s after the window arrived
    assert kept is not None and kept.windows == 1
    clock.now = 13.5  # its step's commit goes on from there
    assert keeper.commit([commit("moved", "m2", 1)])[0][0] == "kept"
    assert keeper.recall("quiet") is None  # 13 s without a window
    clock.now = 13.5 + 10.0 + 120.0 + 1.0  # idle past the timeout and the grace: a longer wait is not believed
    assert keeper.recall("moved", waited_s=500.0) is None
