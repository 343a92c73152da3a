"""The core of `rayparallel serve`, without Ray Serve: streams in slots (Triton's Direct strategy), a model step
for any subset of slots that leaves the others' states untouched, and the KServe v2 protocol's requests.
The oracle for a stream's answers is one process running that stream's windows at batch 1, states carried."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rayparallel.serve.protocol import ProtocolError, TensorSpec, infer_response, parse_infer
from rayparallel.serve.slot_model import SlotModel
from rayparallel.serve.slots import NotStarted, SlotsFull, SlotTable

WINDOW = TensorSpec("co2_features", "FP32", (8, 2))


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_streams_take_free_slots_restart_in_their_own_end_and_expire():
    clock = Clock()
    table = SlotTable(2, idle_timeout_s=1.0, clock=clock)
    assert table.take("a", start=True) == (0, True) and table.take(7, start=True) == (1, True)
    with pytest.raises(SlotsFull, match="every one of the 2 slots"):
        table.take("c", start=True)
    assert table.take("a", start=True) == (0, True)  # a start on a live stream restarts it in its slot
    table.end("a")
    with pytest.raises(NotStarted, match=r"^sequence_start: expected true on the first window of sequence 'a'"):
        table.take("a", start=False)
    assert table.take("c", start=True) == (0, True)  # the freed slot
    clock.now = 1.5  # 7 idle for 1.5 s: freed, and c with it
    with pytest.raises(NotStarted, match="idle past 1 s"):
        table.take(7, start=False)
    assert table.held() == {} and table.take("d", start=True) == (0, True)


def batch_1_loop(weights: list, windows: list[np.ndarray]) -> np.ndarray:
    """One stream's windows through the model built for batch 1, its state carried from window to window."""
    from jobs.stateful_lstm import build_model

    model = build_model(1)
    model.set_weights(weights)
    return np.array([model.predict_on_batch(window[None])[0] for window in windows])


def test_any_interleaving_of_streams_answers_each_as_the_batch_1_loop():
    """8 streams over 4 slots in a random order: some end and others start in their slots, one restarts
    mid-way (its answers from then are a fresh loop's), and a step holds only the streams that sent a window."""
    from jobs.stateful_lstm import build_model

    rng = np.random.default_rng(5)
    served = SlotModel(build_model(4))
    weights = served.model.get_weights()
    table = SlotTable(4, idle_timeout_s=1e9)
    streams = {i: rng.normal(size=(int(rng.integers(3, 9)), 8, 2)).astype("float32") for i in range(8)}
    restart_at = {5: 2}  # stream 5 starts again at its third window
    sent = dict.fromkeys(streams, 0)
    answers: dict[int, list] = {i: [] for i in streams}
    waiting = list(streams)
    live: list[int] = []
    while waiting or live:
        while waiting and len(live) < 4:
            live.append(waiting.pop(0))
        chosen = [i for i in live if rng.random() < 0.6] or live[:1]
        windows, starts = {}, {}
        for i in chosen:
            slot, start = table.take(i, start=sent[i] in (0, restart_at.get(i)))
            if start:
                served.start(slot)
            windows[slot], starts[slot] = streams[i][sent[i]], i
        for slot, outputs in served.step(windows).items():
            i = starts[slot]
            answers[i].append(outputs["change"])
            sent[i] += 1
            if sent[i] == len(streams[i]):
                table.end(i)
                live.remove(i)
    for i, windows in streams.items():
        cut = restart_at.get(i)
        segments = [windows[:cut], windows[cut:]] if cut else [windows]  # a restart: a fresh loop from there
        expected = np.concatenate([batch_1_loop(weights, list(segment)) for segment in segments])
        assert np.abs(np.array(answers[i]) - expected).max() < 1e-5, i


def test_a_stream_moved_to_another_replica_goes_on_from_its_state():
    """What a replica's death needs: a slot's state rows put into another model's slot continue the stream."""
    from jobs.stateful_lstm import build_model

    windows = list(np.random.default_rng(2).normal(size=(6, 8, 2)).astype("float32"))
    first, second = SlotModel(build_model(2)), SlotModel(build_model(3))
    second.model.set_weights(first.model.get_weights())
    first.start(1)
    answers = [first.step({1: w})[1]["change"] for w in windows[:3]]
    second.restore(2, first.states_of([1])[1])
    answers += [second.step({2: w})[2]["change"] for w in windows[3:]]
    assert np.abs(np.array(answers) - batch_1_loop(first.model.get_weights(), windows)).max() < 1e-5


def request(window: np.ndarray | None = None, binary: bool = False, **parameters) -> tuple[bytes, int | None]:
    window = np.zeros((8, 2), "float32") if window is None else window
    tensor = {"name": "co2_features", "shape": [1, 8, 2], "datatype": "FP32"}
    if binary:
        tensor["parameters"] = {"binary_data_size": window.nbytes}
    else:
        tensor["data"] = window.ravel().tolist()
    header = json.dumps({"id": "r1", "inputs": [tensor], "parameters": parameters}).encode()
    return (header + window.tobytes(), len(header)) if binary else (header, None)


def test_requests_as_tritonclient_sends_them_and_the_answer():
    window = np.arange(16, dtype="float32").reshape(8, 2)
    for binary in (False, True):
        parsed = parse_infer(*request(window, binary, sequence_id=7, sequence_start=True), WINDOW)
        assert (parsed.sequence_id, parsed.start, parsed.end) == (7, True, False)
        assert np.array_equal(parsed.window, window)
    answer = infer_response(
        "co2", "1", parsed, {"change": np.ones((8, 1), "float32")}, [TensorSpec("change", "FP32", (8, 1))]
    )
    assert answer["outputs"][0]["shape"] == [1, 8, 1] and answer["id"] == "r1"
    assert answer["parameters"] == {"sequence_id": 7}


@pytest.mark.parametrize(
    "body, expected",
    [
        (b"{not json", "body: expected a JSON inference request, received invalid JSON"),
        (b"[1, 2]", "body: expected a JSON object, received list"),
        (request(sequence_id=0)[0], "sequence_id: expected a non-zero unsigned integer or a non-empty string"),
        (request()[0], "sequence_id: expected a non-zero unsigned integer or a non-empty string, received None"),
        (request(sequence_id=3, sequence_start="yes")[0], "sequence_start: expected true or false, received 'yes'"),
        (request(np.zeros((4, 2), "float32"), sequence_id=3)[0], "inputs['co2_features'].data: expected 16 numbers"),
        (
            request(sequence_id=3)[0].replace(b'"FP32"', b'"INT64"'),
            "inputs['co2_features'].datatype: expected 'FP32', received 'INT64'",
        ),
        (
            request(sequence_id=3)[0].replace(b"[1, 8, 2]", b"[8, 2]"),
            "inputs['co2_features'].shape: expected [1, 8, 2] (one window), received [8, 2]",
        ),
        (
            request(sequence_id=3)[0].replace(b'"co2_features"', b'"x"'),
            "inputs: expected the input 'co2_features', received 'x'",
        ),
        (
            request(sequence_id=3)[0].replace(b'"data": [0.0', b'"data": ["a"'),
            "inputs['co2_features'].data: expected 16 numbers, received",
        ),
        (b"{" + b" " * (16 * 2**20) + b"}", "body: expected at most 16777216 bytes"),
    ],
    ids=["json", "object", "zero_id", "no_id", "flag", "rows", "datatype", "shape", "name", "string", "oversized"],
)
def test_a_bad_request_is_a_4xx_in_one_line(body, expected):
    with pytest.raises(ProtocolError) as info:
        parse_infer(body, None, WINDOW)
    assert str(info.value).startswith(expected) and "\n" not in str(info.value), str(info.value)
    assert 400 <= info.value.status < 500 and info.value.body() == {"error": str(info.value)}
