"""What the tests share: running the CLI as a user would, a real MLflow server, weight comparisons."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


# the console script pip installed beside this interpreter: what a user types (its sys.path is not `python -m`'s)
RAYPARALLEL = str(Path(sys.executable).with_name("rayparallel"))


def doc_section(title: str, page: str = "README.md") -> str:
    """The section of README (or `docs/<page>`) whose heading starts `## {title}`, up to the next section;
    a docs page's whole text when `title` is its own `# ` heading."""
    text = (REPO / page).read_text()
    if text.startswith(f"# {title}"):
        return text
    return text.split(f"\n## {title}", 1)[1].split("\n## ", 1)[0]


def cli(*args: str, env: dict | None = None, cwd: Path = REPO, timeout: float = 600):
    """Run `rayparallel ...` as a user would, through the installed script; returns the CompletedProcess."""
    return subprocess.run(
        [RAYPARALLEL, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=cli_env(env)
    )


def cli_env(env: dict | None) -> dict:
    """This process's environment with `env`'s changes; a value of "" unsets its variable."""
    return {k: v for k, v in {**os.environ, **(env or {})}.items() if v != ""}


def wait_for(condition, timeout: float) -> bool:
    """Whether `condition()` came true within `timeout` seconds (polled)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


SESSION_CPUS = 4  # the session's local Ray (conftest.ray_address): 3 workers fit on 2 cores


def train_shared(shared, spec, overrides=(), **kwargs):
    """`rayparallel.train` on the session's shared workers (`conftest.shared_workers`) when the run fits
    them; else beside them when the CPUs they leave suffice (they idle between runs), else after closing them."""
    from rayparallel.cluster.run import run_job
    from rayparallel.spec import load_spec

    job = load_spec(spec, list(overrides))
    if shared.refusal(job) is None:
        return run_job(spec, overrides=list(overrides), workers=shared, **kwargs)
    held = shared.num_workers * shared.held_per_worker["CPU"]
    if job.scaling.num_workers + (job.data.dataset is not None) > SESSION_CPUS - held:  # Ray Data: a CPU to read
        shared.close()
    return run_job(spec, overrides=list(overrides), **kwargs)


def final_weights(path: str, builder: Callable) -> list[np.ndarray]:
    """A run's weights file loaded into the base model built for batch 1 (any batch loads)."""
    model = builder(batch_size=1)
    model.load_weights(path)
    return model.get_weights()


def max_relative_error(a: list[np.ndarray], b: list[np.ndarray], floor: float = 1e-12) -> float:
    """The largest difference between two weight lists, relative to each tensor's largest value in `b`
    (or to `floor` when that is smaller: a weight whose true gradient is zero, such as an attention
    key's bias, holds round-off only)."""
    return max(float(np.max(np.abs(x - y)) / max(np.max(np.abs(y)), floor)) for x, y in zip(a, b, strict=True))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """A real `mlflow server` on 127.0.0.1 with a sqlite store and a temporary artifact folder."""

    def __init__(self, folder: Path):
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log = open(folder / "mlflow-server.log", "w")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--backend-store-uri",
                f"sqlite:///{folder}/mlflow.db",
                "--artifacts-destination",
                str(folder / "artifacts"),
                "--workers",
                "1",
            ],
            stdout=self.log,
            stderr=self.log,
            start_new_session=True,
        )
        self._wait_healthy()

    def _wait_healthy(self, timeout: float = 240) -> None:  # about 15 s alone; 110 s seen beside other work
        import time
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.process.returncode}; see {self.log.name}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"mlflow server not healthy after {timeout}s; see {self.log.name}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop only this server (its own process group); SIGKILL: lost at once, as a crashed host."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout=20)
            except Exception:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()


def job(name: str, builder: str, loader: str, loader_kwargs: dict, **train) -> dict:
    """A small job from `tests.models`, rows in order (as `fit(shuffle=False)`), global batch 8, seed 4."""
    return {
        "name": name,
        "model": {"builder": f"tests.models:{builder}"},
        "data": {"loader": f"tests.models:{loader}", "kwargs": loader_kwargs, "layout": "streams"},  # fit's order
        "train": {"global_batch_size": 8, "epochs": 3, "seed": 4, **train},
        "mlflow": {"enabled": False},
    }


def keras_fit(builder: Callable, data: dict, compile_args: dict | None, epochs: int = 3, **fit_args):
    """The oracle: plain Keras `fit` in this process, on the rows in order (`shuffle=False`, as
    `layout: streams` feeds them), seed 4 as in `job`; returns the model and its history."""
    import keras

    keras.utils.set_random_seed(4)
    model = builder(batch_size=8)
    if compile_args is not None:  # None: the builder compiled it
        model.compile(**compile_args)
    validation = (data["x_val"], data["y_val"]) + ((data["sample_weight_val"],) if "sample_weight_val" in data else ())
    history = model.fit(
        data["x_train"],
        data["y_train"],
        batch_size=8,
        epochs=epochs,
        shuffle=False,
        validation_data=validation,
        verbose=0,
        **fit_args,
    ).history
    return model, history


def keras_fit_streams(spec: dict):
    """The oracle for a stateful job (`tests.models.lstm_job`, the default job): Keras `fit` in this
    process on its streams in order (`shuffle=False`), the states reset where rayparallel resets them
    (each epoch's start, before and after validation); returns the model and its history."""
    import keras

    from rayparallel.spec.references import resolve

    train, batch = spec["train"], spec["train"]["global_batch_size"]
    keras.utils.set_random_seed(train["seed"])
    model = resolve(spec["model"]["builder"], "model.builder")(batch, **spec["model"].get("kwargs", {}))
    optimizer = keras.optimizers.get(train["optimizer"])
    model.compile(optimizer=optimizer, loss=train.get("loss", "mean_squared_error"), metrics=train.get("metrics", []))
    stateful = [layer for layer in model.layers if getattr(layer, "stateful", False)]

    class ResetStates(keras.callbacks.Callback):
        def reset(self, *_):
            for layer in stateful:
                layer.reset_state()

        on_epoch_begin = on_test_begin = on_test_end = reset

    data = resolve(spec["data"]["loader"], "data.loader")(batch, **spec["data"].get("kwargs", {}))
    history = model.fit(
        data["x_train"],
        data["y_train"],
        batch_size=batch,
        epochs=train["epochs"],
        shuffle=False,
        validation_data=(data["x_val"], data["y_val"]),
        callbacks=[ResetStates()],
        verbose=0,
    ).history
    return model, history


class DefaultJobRuns:
    """The default job run through the CLI on its 2 workers (3 epochs) as README's quick start runs it: from
    a folder holding `jobs/`, into MLflow's default store there (`cwd/mlflow.db`). Shared by tests."""

    def __init__(self, root: Path, address: str):
        self.results, self.stdout, self.stderr = {}, {}, {}
        self.cwd = root / "work"
        shutil.copytree(REPO / "jobs", self.cwd / "jobs")
        self.env = {"RAY_ADDRESS": address, "MLFLOW_TRACKING_URI": ""}
        for workers in (2,):  # one worker is `fit`'s oracle in tests/test_cli.py
            out = self.cwd / "runs/stateful-lstm-co2"  # the job's own folder, where README's next commands look
            overrides = [f"scaling.num_workers={workers}", "train.epochs=3"]
            sets = [arg for o in overrides for arg in ("--set", o)]
            run = cli("train", "jobs/stateful_lstm.yaml", *sets, env=self.env, cwd=self.cwd)
            assert run.returncode == 0, run.stderr[-3000:]
            self.stdout[workers], self.stderr[workers] = run.stdout, run.stderr
            self.results[workers] = json.loads((out / "result.json").read_text())

    @staticmethod
    def weights(path: str) -> list:
        from jobs.stateful_lstm import build_model

        return final_weights(path, build_model)
