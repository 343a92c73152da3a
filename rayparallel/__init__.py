"""rayparallel: data-parallel Keras training on Ray Train, stateful models included.

>>> import rayparallel
>>> result = rayparallel.train("jobs/stateful_lstm.yaml", overrides=["train.epochs=2"])  # doctest: +SKIP
"""

from .api import Workers, fit, shutdown, train, tune, validate
from .checkpoint.export import Exported, export, load_model
from .errors import RayParallelError
from .inference.output import read_predictions
from .inference.run import predict
from .result import TrainResult
from .serve.run import Served, serve
from .spec import JobSpec, Shard, load_spec
from .tuning.result import SweepResult
from .version import __version__

__all__ = [
    "fit",
    "train",
    "tune",
    "validate",
    "shutdown",
    "Workers",
    "predict",
    "read_predictions",
    "serve",
    "Served",
    "load_model",
    "export",
    "load_spec",
    "JobSpec",
    "Shard",
    "TrainResult",
    "SweepResult",
    "Exported",
    "RayParallelError",
    "__version__",
]
