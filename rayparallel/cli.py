"""`rayparallel train|validate|tune|submit|export|predict|serve`: the command line over the Python API.

Bad input exits with code 2 and one line on stderr; `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

from .errors import RayParallelError, RunFailedError
from .spec.references import add_search_path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rayparallel", description="Data-parallel Keras training on Ray.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for bad input")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_train_and_validate(commands)
    _add_tune(commands)
    _add_submit_and_export(commands)
    _add_predict(commands)
    _add_serve(commands)
    return parser


def _add_train_and_validate(commands: argparse._SubParsersAction) -> None:
    for name, text in (("train", "train a job"), ("validate", "check a job without training")):
        command = commands.add_parser(name, help=text)
        command.add_argument("job", help="job YAML file")
        _repeatable(command, "--set", "overrides", "KEY=VALUE", "override a spec value, e.g. train.epochs=3")
        if name == "train":
            command.add_argument(
                "--output-dir", default=None, help="where result.json and weights go (default runs/NAME)"
            )
            command.add_argument(
                "--worker-logs", action="store_true", help="show the workers' own output (TF, Ray Train)"
            )
            restart = command.add_mutually_exclusive_group()
            restart.add_argument(
                "--resume",
                dest="resume",
                action="store_const",
                const=True,
                default=None,
                help="continue the run in the output dir from its last completed epoch",
            )
            restart.add_argument(
                "--fresh",
                dest="resume",
                action="store_const",
                const=False,
                help="start a new run even if the output dir holds an unfinished one "
                "(default: resume an unfinished run, else start fresh)",
            )


def _add_tune(commands: argparse._SubParsersAction) -> None:
    tune = commands.add_parser("tune", help="sweep a job's settings with Ray Tune, every trial a full run")
    tune.add_argument("job", help="job YAML file")
    _repeatable(
        tune,
        "--param",
        "params",
        "KEY=SPACE",
        "a spec key and its space: choice(a,b) grid(a,b) uniform(lo,hi) loguniform(lo,hi) randint(lo,hi); adds to "
        "the job's tune.params",
    )
    _repeatable(tune, "--set", "overrides", "KEY=VALUE", "override a spec value of every trial")
    tune.add_argument("--samples", type=int, default=None, help="Tune's num_samples: repeats of the grid (default 1)")
    tune.add_argument("--max-concurrent", type=int, default=None, help="trials at once (default: what fits)")
    tune.add_argument("--metric", default=None, help="the epoch figure to optimize (default val_loss, else loss)")
    tune.add_argument("--mode", choices=("min", "max"), default=None, help="default min")
    tune.add_argument("--scheduler", choices=("fifo", "asha"), default=None, help="default fifo")
    tune.add_argument("--output-dir", default=None, help="the sweep's folder (default runs/NAME-tune)")
    tune.add_argument("--resume", action="store_true", help="run the recorded sweep's trials that did not finish")
    tune.add_argument("--worker-logs", action="store_true", help="show the trials' own output")


def _add_submit_and_export(commands: argparse._SubParsersAction) -> None:
    submit = commands.add_parser("submit", help="run a job on a Ray cluster through the Jobs API")
    submit.add_argument("job", help="job YAML file (inside the working dir)")
    submit.add_argument("--address", required=True, help="the cluster's dashboard, e.g. http://HEAD:8265")
    _repeatable(submit, "--set", "overrides", "KEY=VALUE", "override a spec value")
    submit.add_argument("--working-dir", default=None, help="folder to upload (default: the current one)")
    submit.add_argument("--no-wait", action="store_true", help="return once submitted instead of following the logs")
    submit.add_argument(
        "--output-dir", default=None, help="output folder on the cluster (default runs/NAME in the job's dir)"
    )
    submit.add_argument("--verbose", action="store_true", help="show Ray's lines about packing the working dir")
    export = commands.add_parser("export", help="rebuild the base model at a batch size and save it as .keras")
    export.add_argument("checkpoint", help="a .weights.h5 file or a checkpoint folder (then its best file)")
    export.add_argument("--batch-size", type=int, default=1, help="batch size of the exported model (default 1)")
    export.add_argument("--out", required=True, help="output .keras file")
    _repeatable(
        export, "--set", "overrides", "model.kwargs.KEY=VALUE", "rebuild with another builder argument, e.g. window=1"
    )
    export.add_argument(
        "--unlisted", action="store_true", help="accept a weights file the folder's manifest does not list"
    )


def _add_predict(commands: argparse._SubParsersAction) -> None:
    predict = commands.add_parser("predict", help="predict the job's rows with trained weights, on Ray workers")
    predict.add_argument("job", help="job YAML file")
    predict.add_argument("--weights", required=True, help="a .weights.h5 file or a checkpoint folder (then its best)")
    predict.add_argument("--out", required=True, help="folder for the Parquet files and predict.json")
    predict.add_argument(
        "--split", default="predict", choices=("predict", "val"), help="the loader's x_predict (default) or x_val"
    )
    _repeatable(predict, "--set", "overrides", "KEY=VALUE", "override a spec value, e.g. predict.batch_size=512")
    predict.add_argument("--num-workers", type=int, default=None, help="default: the job's scaling.num_workers")
    predict.add_argument("--use-gpu", action="store_true", default=None, help="one GPU per worker")
    predict.add_argument(
        "--continue-states",
        action="store_true",
        help="layout streams: start each stream from its state at the end of the loader's x_train (default: zero)",
    )
    predict.add_argument("--overwrite", action="store_true", help="replace an earlier prediction in --out")
    predict.add_argument("--unlisted", action="store_true", help="accept a weights file the manifest does not list")
    predict.add_argument("--worker-logs", action="store_true", help="show the workers' own output")


def _add_serve(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser("serve", help="serve the job's stateful model to live streams (KServe v2, Ray Serve)")
    serve.add_argument("job", help="job YAML file")
    serve.add_argument("--weights", help="a .weights.h5 file or a checkpoint folder (then its best)")
    serve.add_argument("--model", help="or a registered model: models:/NAME@ALIAS (e.g. @champion) or models:/NAME/N")
    serve.add_argument("--name", default=None, help="the model's name in /v2/models/NAME (default: the job's name)")
    serve.add_argument("--replicas", type=int, default=1, help="Ray Serve replicas (default 1)")
    serve.add_argument("--slots", type=int, default=None, help="streams a replica holds (default: the global batch)")
    serve.add_argument("--idle-timeout-s", type=float, default=60.0, help="a stream idle this long is freed (60)")
    serve.add_argument("--slot-wait-s", type=float, default=5.0, help="how long a start waits for a slot, then 503 (5)")
    serve.add_argument("--use-gpu", action="store_true", default=None, help="one GPU per replica")
    serve.add_argument(
        "--keep-states",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep each stream's state outside the replicas, so a replica's death loses none (default: on)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    serve.add_argument(
        "--proxy-location", default="EveryNode", help="where the fronts (HAProxy) run: EveryNode (default) or HeadOnly"
    )
    serve.add_argument("--detach", action="store_true", help="leave it running on the cluster in RAY_ADDRESS")
    _repeatable(serve, "--set", "overrides", "KEY=VALUE", "override a spec value")
    serve.add_argument("--unlisted", action="store_true", help="accept a weights file the manifest does not list")
    serve.add_argument("--worker-logs", action="store_true", help="show the replicas' own output")


def _repeatable(command: argparse.ArgumentParser, flag: str, dest: str, metavar: str, text: str) -> None:
    command.add_argument(flag, dest=dest, action="append", default=[], metavar=metavar, help=f"{text} (repeatable)")


def _builder_kwargs(overrides: list[str]) -> dict:
    """`export --set model.kwargs.window=1` -> {"window": 1}: only the builder's arguments change."""
    from .spec import apply_overrides

    for item in overrides:
        if not item.startswith("model.kwargs."):
            raise RayParallelError(f"--set: expected model.kwargs.KEY=VALUE (a builder argument), received {item!r}")
    return apply_overrides({}, overrides).get("model", {}).get("kwargs", {})


def _param(item: str) -> tuple[str, str]:
    key, sep, space = item.partition("=")
    if not sep or not key.strip():
        raise RayParallelError(f"--param: expected KEY=SPACE, e.g. model.kwargs.units=choice(16,32), received {item!r}")
    return key.strip(), space


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # every command resolves a job's `module:function` from where it was typed, as `python -m` would:
    # the installed console script does not put the working directory on sys.path by itself
    add_search_path([os.getcwd()])
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        return 130
    except (RayParallelError, RunFailedError) as exc:  # bad input (exit 2), or a process the run needs died (1)
        if args.debug:
            raise
        print(f"rayparallel: error: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, RunFailedError) else 2


def _train(args: argparse.Namespace) -> int:
    from .cluster.run import run_job
    from .startup import process_started_at

    signal.signal(signal.SIGTERM, _interrupt)  # `ray job stop` ends the run like Ctrl-C
    run_job(
        args.job,
        overrides=args.overrides,
        output_dir=args.output_dir,
        worker_logs=args.worker_logs or args.debug,  # --debug also shows TensorFlow's and the workers' output
        resume=args.resume,
        started_at=process_started_at(),
    )
    return 0


def _validate(args: argparse.Namespace) -> int:
    from .api import validate

    job = validate(args.job, args.overrides)
    print(f"{args.job}: valid ({job.scaling.described} workers x batch {job.batch_split()})")
    return 0


def _tune(args: argparse.Namespace) -> int:
    from .api import tune

    signal.signal(signal.SIGTERM, _interrupt)
    tune(
        args.job,
        params=dict(_param(item) for item in args.params),
        overrides=args.overrides,
        samples=args.samples,
        max_concurrent=args.max_concurrent,
        metric=args.metric,
        mode=args.mode,
        scheduler=args.scheduler,
        output_dir=args.output_dir,
        resume=args.resume,
        worker_logs=args.worker_logs or args.debug,
    )
    return 0


def _submit(args: argparse.Namespace) -> int:
    from .cluster.submit import submit

    return submit(
        args.job,
        args.address,
        args.overrides,
        wait=not args.no_wait,
        working_dir=args.working_dir,
        output_dir=args.output_dir,
        verbose=args.verbose or args.debug,
    )


def _export(args: argparse.Namespace) -> int:
    from .checkpoint.export import export

    kwargs = _builder_kwargs(args.overrides)
    done = export(args.checkpoint, out=args.out, batch_size=args.batch_size, unlisted=args.unlisted, **kwargs)
    changed = f" with {kwargs}" if kwargs else ""
    print(f"exported {done.weights} ({done.why}) at batch size {args.batch_size}{changed} to {done.path}")
    return 0


def _predict(args: argparse.Namespace) -> int:
    from .inference.run import predict

    signal.signal(signal.SIGTERM, _interrupt)
    predict(
        args.job,
        weights=args.weights,
        out=args.out,
        split=args.split,
        overrides=args.overrides,
        num_workers=args.num_workers,
        use_gpu=args.use_gpu,
        continue_states=args.continue_states,
        overwrite=args.overwrite,
        unlisted=args.unlisted,
        worker_logs=args.worker_logs or args.debug,
    )
    return 0


def _serve(args: argparse.Namespace) -> int:
    from .serve.run import serve, stay_up

    if args.detach and not os.environ.get("RAY_ADDRESS"):
        raise RayParallelError(
            "--detach: expected a running Ray cluster in RAY_ADDRESS to leave the application on, received none "
            "(a local Ray ends with this command)"
        )
    signal.signal(signal.SIGTERM, _interrupt)  # `ray job stop` ends it like Ctrl-C
    served = serve(
        args.job,
        weights=args.weights,
        model=args.model,
        name=args.name,
        replicas=args.replicas,
        slots=args.slots,
        idle_timeout_s=args.idle_timeout_s,
        slot_wait_s=args.slot_wait_s,
        use_gpu=args.use_gpu,
        keep_states=args.keep_states,
        host=args.host,
        port=args.port,
        proxy_location=args.proxy_location,
        overrides=args.overrides,
        unlisted=args.unlisted,
        worker_logs=args.worker_logs or args.debug,
    )
    if not args.detach:
        print("rayparallel serve: up until Ctrl-C", flush=True)
        stay_up(served.name)
    return 0


COMMANDS = {
    "train": _train,
    "validate": _validate,
    "tune": _tune,
    "submit": _submit,
    "export": _export,
    "predict": _predict,
    "serve": _serve,
}


if __name__ == "__main__":
    sys.exit(main())
