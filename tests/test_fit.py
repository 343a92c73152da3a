"""`rayparallel.fit` as notebook and script users call it: a builder, a custom layer and arrays
defined in `__main__` (a notebook's kernel, a script), trained on 2 workers, equal to plain Keras
`fit` in this process; and its bad input, one line each before anything starts."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import rayparallel
from rayparallel.errors import RayParallelError

from .helpers import REPO, doc_section, final_weights, max_relative_error, wait_for


def readme_cells() -> list[str]:
    """The two code blocks of README's "From a notebook" section: the notebook's cells, the script's lines."""
    section = doc_section("From a notebook")
    return [block.split("\n", 1)[1] for block in section.split("```python")[1:]]


MODEL_CELL, FIT_CELL = (cell.split("```", 1)[0] for cell in readme_cells())
FINAL = Path("runs/fit-build/checkpoints/final.weights.h5")  # the default output folder, in the kernel's folder


@pytest.fixture(scope="module")
def plain_fit():
    """The oracle: the cell's model trained by Keras `fit` here, states reset where rayparallel resets them."""
    import keras

    cell: dict = {}
    exec(MODEL_CELL, cell)

    class ResetStates(keras.callbacks.Callback):
        def reset(self, *_):
            for layer in self.model.layers:
                if getattr(layer, "stateful", False):
                    layer.reset_state()

        on_epoch_begin = on_test_begin = on_test_end = reset

    model = cell["build"](8)
    history = model.fit(
        cell["x"],
        cell["y"],
        batch_size=8,
        epochs=2,
        shuffle=False,
        validation_data=(cell["x_val"], cell["y_val"]),
        callbacks=[ResetStates()],
        verbose=0,
    ).history
    return model.get_weights(), history


def assert_same_as_plain_fit(folder: Path, plain_fit, label: str) -> None:
    """The run's final weights (loaded here, where `Halve` is not defined: the builder came by value) equal fit's."""
    path = folder / FINAL
    model = rayparallel.load_model(path.parent, batch_size=1)
    error = max_relative_error(final_weights(path, lambda batch_size: model), plain_fit[0])
    print(f"{label}: rayparallel.fit on 2 workers vs Keras fit, max relative weight error {error:.2e}")
    assert error < 1e-5
    assert type(model.layers[1]).__name__ == "Halve" and model.inputs[0].shape[0] == 1


# The same script then sweeps: rayparallel.tune takes a spec whose builder and loader live in `__main__`.
TUNE = """
def load():
    return {"x_train": x, "y_train": y, "x_val": x_val, "y_val": y_val}


job = {
    "name": "tune-main",
    "model": {"builder": build},
    "data": {"loader": load, "layout": "streams"},
    "train": {"global_batch_size": 8, "epochs": 1},
    "scaling": {"num_workers": 1},
    "mlflow": {"enabled": False},
}
sweep = rayparallel.tune(job, params={"train.seed": "grid(1)"}, output_dir="sweep", verbose=False)
print("SWEEP", [trial["status"] for trial in sweep.trials], sweep.best_weights)
"""


@pytest.mark.slow
def test_a_script_whose_builder_lives_in_main_trains_what_fit_trains(ray_address, tmp_path, plain_fit):
    """...and sweeps the same `__main__` builder and loader with `rayparallel.tune`."""
    script = tmp_path / "train_script.py"
    script.write_text(MODEL_CELL + "\n" + FIT_CELL + TUNE)
    run = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**__import__("os").environ, "RAY_ADDRESS": ray_address},
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Epoch 2/2" in run.stdout and "val_mae" in run.stdout
    assert_same_as_plain_fit(tmp_path, plain_fit, "script")
    recorded = (tmp_path / "runs/fit-build/job.yaml").read_text()
    assert "builder: __main__:build" in recorded and "loader: rayparallel.data.in_memory:InMemoryData" in recorded
    (swept,) = [line for line in run.stdout.splitlines() if line.startswith("SWEEP")]
    assert swept.startswith("SWEEP ['FINISHED']") and swept.endswith("final.weights.h5"), swept


class Kernel:
    """A real Jupyter kernel (as a notebook runs cells) in `cwd`, with this process's environment."""

    def __init__(self, cwd: Path):
        from jupyter_client.manager import start_new_kernel

        self.manager, self.client = start_new_kernel(kernel_name="python3", cwd=str(cwd))

    def run(self, code: str, interrupt_on: str | None = None, timeout: float = 600) -> tuple[str, str]:
        """The cell's printed text (an error as `Name: value`) and its status (`ok`, `error`); with
        `interrupt_on`, the kernel is interrupted (as the notebook's stop button does) once that text shows."""
        msg_id, printed, deadline = self.client.execute(code), [], time.monotonic() + timeout
        while True:
            message = self.client.get_iopub_msg(timeout=max(deadline - time.monotonic(), 1))
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                printed.append(content["text"])
            elif kind == "error":
                printed.append(f"{content['ename']}: {content['evalue']}")
            elif kind == "status" and content["execution_state"] == "idle":
                return "".join(printed), self.client.get_shell_msg(timeout=60)["content"]["status"]
            if interrupt_on and interrupt_on in "".join(printed):
                self.manager.interrupt_kernel()
                interrupt_on = None

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


RESULT_CELL = "print('RESULT', result.final_weights, 'workers_reused' in result.startup, len(result.workers))"


def fitted(kernel: Kernel, cell: str, plain_fit, label: str) -> tuple[str, bool, list]:
    """Run a fit cell; its weights equal Keras `fit`'s (compared now: the next fit moves them aside).
    Returns what it printed, whether it ran on the workers kept warm from the call before, its weights."""
    printed, status = kernel.run(cell)
    assert status == "ok", printed[-3000:]
    path, reused, workers = kernel.run(RESULT_CELL)[0].split()[1:]
    model = rayparallel.load_model(Path(path).parent, batch_size=1)  # `Halve` is not defined here: it came by value
    weights = final_weights(path, lambda batch_size: model)
    error = max_relative_error(weights, plain_fit[0])
    print(f"{label}: rayparallel.fit on {workers} workers vs Keras fit, max relative weight error {error:.2e}")
    assert error < 1e-5 and type(model.layers[1]).__name__ == "Halve" and model.inputs[0].shape[0] == 1
    return printed, reused == "True", weights


@pytest.mark.slow
def test_a_notebook_keeps_its_workers_warm_and_every_fit_equals_fit(ray_address, tmp_path, plain_fit, monkeypatch):
    """README's cells in a real Jupyter kernel: the console's lines are the cell's output (the workers' own
    logs held back); the next fit (and docs/python.md's `train` between them) runs on the workers kept
    warm; another worker count replaces them; a fit interrupted in the kernel leaves the next one working, on
    workers started ahead (`rayparallel.Workers`); `rayparallel.shutdown()` gives their CPU back."""
    import ray

    monkeypatch.setenv("RAY_ADDRESS", ray_address)  # the kernel joins this session's Ray
    monkeypatch.delenv("RAYPARALLEL_WARM_WORKERS")  # as a user's kernel: warm workers on
    shutil.copytree(REPO / "jobs", tmp_path / "jobs")  # docs/python.md's job, from the kernel's folder
    kernel = Kernel(tmp_path)
    try:
        assert kernel.run(MODEL_CELL)[1] == "ok"
        printed, reused, cold = fitted(kernel, FIT_CELL, plain_fit, "notebook, cold")
        assert "Epoch 1/2" in printed and "Epoch 2/2" in printed and "finished in" in printed, printed[-2000:]
        assert "RayTrainWorker" not in printed and "cuda" not in printed.lower()  # held back, as on a terminal
        assert not reused

        trained, status = kernel.run(
            doc_section("Use it from Python", "docs/python.md").split("```python\n")[1].split("```")[0]
        )
        assert status == "ok" and "on the warm workers (2 workers)\n" in trained, trained[-3000:]
        printed, reused, warm = fitted(kernel, FIT_CELL, plain_fit, "notebook, warm")
        assert all(np.array_equal(a, b) for a, b in zip(cold, warm, strict=True))  # nothing of a run leaks
        assert reused and "on the warm workers (2 workers)\n" in printed

        one = FIT_CELL.replace("num_workers=2", "num_workers=1")
        printed, reused, _ = fitted(kernel, one, plain_fit, "notebook, 1 worker")
        assert not reused and "replacing the warm workers (2 workers) with 1 worker" in printed, printed[-2000:]

        long = one.replace("epochs=2", "epochs=500")
        printed, status = kernel.run(long, interrupt_on="Epoch 3/500")
        assert status == "error" and "KeyboardInterrupt" in printed and "Epoch 400/500" not in printed, printed[-2000:]
        # the interrupted run's workers were ended with it: docs/notebook.md starts the next ones ahead
        started, shutdown = (
            block.split("```")[0]
            for block in doc_section("The next fit starts in seconds: warm workers", "docs/notebook.md").split(
                "```python\n"
            )[1:]
        )
        assert kernel.run(started) == ("", "ok")
        assert kernel.run("print(workers)")[0] == "Workers(1 worker)\n"
        printed, reused, _ = fitted(kernel, one, plain_fit, "notebook, after an interrupt, workers started ahead")
        assert reused and "on the warm workers (1 worker)\n" in printed

        held = ray.available_resources().get("CPU", 0)
        assert kernel.run(shutdown) == ("", "ok")
        assert wait_for(lambda: ray.available_resources().get("CPU", 0) == held + 1, 60)  # the worker's CPU back
    finally:
        kernel.close()


def build_digits(batch_size):
    """A Keras tutorial's classifier: 64 features, a hidden layer, ten classes; its batch is free (`shape=`)."""
    import keras

    inputs = keras.Input(shape=(64,))
    hidden = keras.layers.Dense(32, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(hidden))
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


@pytest.mark.slow
def test_rows_that_do_not_fill_the_last_batch_train_as_fit_trains_them(ray_address, tmp_path):
    """scikit-learn's digits as a notebook user passes them: `validation_split=0.22` of the 1,797 rows (Keras'
    split: 1,401 training rows, whose last batch of 64 holds 57, split 29/28 over the workers, and 396
    validation rows, 12 in the last), `class_weight`, `EarlyStopping` and `CSVLogger` instances,
    `shuffle=False`: the last batches are trained on and evaluated, as Keras `fit` in this process does."""
    import keras
    from sklearn.datasets import load_digits

    digits = load_digits()
    x, y = (digits.data / 16.0).astype("float32"), digits.target.astype("int32")
    class_weight = {digit: 1.0 + digit / 10 for digit in range(10)}

    def callbacks(folder: Path) -> list:
        return [keras.callbacks.EarlyStopping(patience=1), keras.callbacks.CSVLogger(str(folder / "log.csv"))]

    keras.utils.set_random_seed(4)
    model = build_digits(64)
    arguments = dict(batch_size=64, epochs=3, validation_split=0.22, class_weight=class_weight, shuffle=False)
    history = model.fit(x, y, callbacks=callbacks(tmp_path), verbose=0, **arguments).history
    result = rayparallel.fit(
        build_digits, x, y, callbacks=callbacks(Path(".")), train={"seed": 4}, output_dir=tmp_path / "run",
        mlflow={"enabled": False}, verbose=False, **arguments,
    )  # fmt: skip
    error = max_relative_error(final_weights(result.final_weights, build_digits), model.get_weights())
    print(f"digits, validation_split: rayparallel.fit on 2 workers vs Keras fit, max relative weight error {error:.2e}")
    assert error < 1e-5
    for key, values in history.items():
        assert [epoch[key] for epoch in result.history] == pytest.approx(values, rel=1e-4), key
    assert (tmp_path / "run/log.csv").read_text().count("\n") == len(history["loss"]) + 1


def build_dense(batch_size):
    import keras

    inputs = keras.Input(batch_shape=(batch_size, 3))
    return keras.Model(inputs, keras.layers.Dense(1)(inputs))


ROWS = np.zeros((32, 3), "float32"), np.zeros((32, 1), "float32")


@pytest.mark.parametrize(
    "arguments, expected",
    [
        (dict(batch_size=8, validation_split=1.5), "validation_split: expected a fraction between 0 and 1"),
        (dict(batch_size=8, validation_split=0.99), "validation_split: expected rows on both sides of the split"),
        ({}, "batch_size: expected the global batch size (an integer), received None"),
        (dict(batch_size=8, y=ROWS[1][:30]), "y: expected as many rows as x (32), received 30"),
        (dict(batch_size=8, y=None), "y: expected the targets of x's rows, received None beside x of 32 rows"),
        (dict(batch_size=8, validation_data=[1, 2]), "validation_data: expected (x_val, y_val)"),
        (dict(batch_size=8, trian={"epochs": 2}), "trian: unknown key; expected one of ['checkpoint', 'data'"),
    ],
    ids=[
        "validation_split",
        "validation_split_empty",
        "no_batch_size",
        "lengths",
        "no_y",
        "validation_data",
        "unknown_setting",
    ],
)
def test_bad_input_is_one_line_before_anything_starts(arguments, expected):
    arguments = {"x": ROWS[0], "y": ROWS[1], **arguments}
    with pytest.raises(RayParallelError) as info:
        rayparallel.fit(build_dense, **arguments)
    assert str(info.value).startswith(expected) and "\n" not in str(info.value), str(info.value)


def test_a_builder_that_cannot_be_pickled_and_a_tf_data_x_are_refused():
    import threading

    import tensorflow as tf

    lock = threading.Lock()

    def build_with_a_lock(batch_size):
        with lock:
            return build_dense(batch_size)

    with pytest.raises(RayParallelError, match=r"^model.builder: expected a function Ray can send .*_thread.lock"):
        rayparallel.fit(build_with_a_lock, *ROWS, batch_size=8)
    dataset = tf.data.Dataset.from_tensor_slices(ROWS).batch(8)
    with pytest.raises(
        RayParallelError, match=r"^x: expected arrays, a keras.utils.PyDataset or the function .*x=make_dataset"
    ):
        rayparallel.fit(build_dense, dataset, batch_size=8)
    with pytest.raises(RayParallelError, match=r"^y: expected None with a function x .*received array"):
        rayparallel.fit(build_dense, lambda: dataset, ROWS[1], batch_size=8)
    with pytest.raises(RayParallelError, match=r"^validation_split: expected arrays x \(fit splits only arrays\)"):
        rayparallel.fit(build_dense, lambda: dataset, validation_split=0.2, batch_size=8)
    with pytest.raises(RayParallelError, match=r"^validation_data: expected a function that returns the validation"):
        rayparallel.fit(build_dense, lambda: dataset, validation_data=dataset, batch_size=8)


def test_the_example_notebook_is_the_readme_example():
    notebook = json.loads((REPO / "examples" / "fit.ipynb").read_text())
    code = ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert [cell.strip() for cell in code] == [cell.strip() for cell in (MODEL_CELL, FIT_CELL)]


def test_callback_instances_go_to_the_ranks_that_run_their_kind():
    """`fit(callbacks=[...])` instances: each rank gets its copy with the spec; writers run on rank 0 only,
    those that change training on every rank, and Keras' checkpoint callbacks are refused as in a job."""
    import keras

    from rayparallel.worker.callbacks import make_callbacks

    early, logger = keras.callbacks.EarlyStopping(patience=2), keras.callbacks.CSVLogger("log.csv")
    assert make_callbacks([early, logger], rank=0, output_dir="out") == [early, logger]
    assert make_callbacks([early, logger], rank=1, output_dir="out") == [early]
    assert logger.filename == "out/log.csv"  # under the run's folder, as a job's relative paths are
    refused = r"^train.callbacks\[0\]: expected a callback that runs across workers, received ModelCheckpoint"
    with pytest.raises(RayParallelError, match=refused):
        make_callbacks([keras.callbacks.ModelCheckpoint("x.keras")], rank=0, output_dir="out")
