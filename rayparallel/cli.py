"""`rayparallel train|validate`: the command line over the Python API.

Bad input exits with code 2 and one line on stderr; `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

from .errors import RayParallelError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rayparallel", description="Data-parallel Keras training on Ray.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for bad input")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (("train", "train a job"), ("validate", "check a job without training")):
        command = commands.add_parser(name, help=text)
        command.add_argument("job", help="job YAML file")
        command.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a spec value, e.g. train.epochs=3 (repeatable)",
        )
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
    submit = commands.add_parser("submit", help="run a job on a Ray cluster through the Jobs API")
    submit.add_argument("job", help="job YAML file (inside the working dir)")
    submit.add_argument("--address", required=True, help="the cluster's dashboard, e.g. http://HEAD:8265")
    submit.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    submit.add_argument("--working-dir", default=None, help="folder to upload (default: the current one)")
    submit.add_argument("--no-wait", action="store_true", help="return once submitted instead of following the logs")
    submit.add_argument(
        "--output-dir", default=None, help="output folder on the cluster (default runs/NAME in the job's dir)"
    )
    export = commands.add_parser("export", help="rebuild the base model at a batch size and save it as .keras")
    export.add_argument("checkpoint", help="a .weights.h5 file or a checkpoint folder (then its best file)")
    export.add_argument("--batch-size", type=int, default=1, help="batch size of the exported model (default 1)")
    export.add_argument("--out", required=True, help="output .keras file")
    export.add_argument(
        "--unlisted", action="store_true", help="accept a weights file the folder's manifest does not list"
    )
    return parser


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "submit":
            from .cluster.submit import submit

            return submit(
                args.job,
                args.address,
                args.overrides,
                wait=not args.no_wait,
                working_dir=args.working_dir,
                output_dir=args.output_dir,
            )
        if args.command == "export":
            from .checkpoint.export import export

            path = export(args.checkpoint, args.out, args.batch_size, args.unlisted)
            print(f"exported {args.checkpoint} at batch size {args.batch_size} to {path}")
        elif args.command == "validate":
            from .api import validate

            job = validate(args.job, args.overrides)
            print(f"{args.job}: valid ({job.scaling.described} workers x batch {job.batch_split()})")
        else:
            from .api import _train
            from .startup import process_started_at

            signal.signal(signal.SIGTERM, _interrupt)  # `ray job stop` ends the run like Ctrl-C
            shown = args.worker_logs or args.debug  # --debug also shows TensorFlow's and the workers' output
            _train(args.job, args.overrides, args.output_dir, True, shown, args.resume, process_started_at())
    except KeyboardInterrupt:
        return 130
    except RayParallelError as exc:
        if args.debug:
            raise
        print(f"rayparallel: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
