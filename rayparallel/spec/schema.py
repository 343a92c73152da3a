"""The job spec as typed objects: one dataclass per YAML section.

Field names follow the words users already know: Keras' `compile`/`fit` arguments in
`train`, Ray's `ScalingConfig` in `scaling` and `RunConfig` in `run`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Reference = str | Callable  # "module:function", or the function itself (sent to the workers by value)
Identifier = str | dict  # a Keras identifier: "adam" or {"class_name": ..., "config": ...}


def rank_rows(global_batch_size: int, num_workers: int, rank: int) -> tuple[int, int]:
    """Rank `rank`'s rows `[start, stop)` of every global batch.

    Contiguous, and as even as they can be: the first `B % N` ranks take one row more. The
    loss is still divided by the global batch, so any worker count trains the same model.

    >>> [rank_rows(16, 3, r) for r in range(3)]
    [(0, 6), (6, 11), (11, 16)]
    """
    base, extra = divmod(global_batch_size, num_workers)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


@dataclass
class ModelSpec:
    """`builder(batch_size=<per-worker batch>, **kwargs)` returns a keras.Model (compiled or not)."""

    builder: Reference
    kwargs: dict = field(default_factory=dict)


@dataclass
class Shard:
    """What a rank-aware loader (`def load(shard, ...)`) is told: which rows are this worker's.

    `streams` is the range of stream indices it owns with `layout: streams` (its rows of every
    global batch); a loader returns those streams only, interleaved step by step as a plain
    loader does for all of them. With `layout: shuffle` it returns any share of the rows (its
    own files, `rank::num_workers`), reshuffled within the worker every epoch.
    """

    rank: int
    num_workers: int
    batch_size: int  # this worker's rows per step
    global_batch_size: int
    streams: range

    @classmethod
    def of(cls, rank: int, num_workers: int, global_batch_size: int) -> Shard:
        """Rank `rank`'s shard among `num_workers`: its slice of every global batch (`rank_rows`)."""
        start, stop = rank_rows(global_batch_size, num_workers, rank)
        return cls(rank, num_workers, stop - start, global_batch_size, range(start, stop))


@dataclass
class DataSpec:
    """Where the rows come from: an in-memory `loader`, or Ray Data through `dataset`.

    `loader(**kwargs)` returns `{x_train, y_train[, x_val, y_val][, baselines]}`. It is called
    once and its arrays are shared by the workers of a node through Ray's object store; a
    loader with a `shard` argument is called by every worker for its own rows instead (see
    `Shard`). If the loader accepts a `global_batch_size` argument it is given the job's
    global batch (stream loaders need it to interleave the streams).

    `dataset(**kwargs)` returns a `ray.data.Dataset` (and `val_dataset(**kwargs)` the
    validation one); `x` names the feature column(s), `y` the label column(s). Workers read
    only their share, streamed: with `layout: shuffle` Ray Train's split of each epoch (block
    order and a buffer of rows reshuffled from the seed and epoch), with `layout: streams` the
    rows of the streams they own, filtered before they reach the worker (rows carry `stream`
    and `t` columns, stored in `t`-major order: every `t` for all streams, then the next).

    `layout: streams` keeps row order (stateful sequence streams); `shuffle` reshuffles
    every epoch from the seed.
    """

    loader: Reference | None = None
    kwargs: dict = field(default_factory=dict)
    dataset: Reference | None = None
    val_dataset: Reference | None = None
    predict_dataset: Reference | None = None  # `rayparallel predict`'s rows (Ray Data), else the loader's x_predict
    x: str | list = "x"
    y: str | list = "y"
    layout: Literal["streams", "shuffle"] = "shuffle"
    check_finite: bool = False


@dataclass
class TrainSpec:
    """What Keras users pass to `compile` and `fit`."""

    global_batch_size: int
    epochs: int = 1
    # None: the builder's compile(...) settings if it compiled its model, else adam and mean_squared_error
    optimizer: Identifier | None = None
    loss: Identifier | None = None  # or {output name: loss} for several outputs, as in compile
    loss_weights: dict | list | None = None  # several outputs: their weights in the total loss
    metrics: list | dict = field(default_factory=list)  # or {output name: [metrics]}
    weighted_metrics: list | dict = field(default_factory=list)  # metrics the sample (or class) weights weigh
    # Keras callbacks: {class_name: EarlyStopping, config: {...}} or {class: module:Class, kwargs: {...}}
    callbacks: list = field(default_factory=list)
    class_weight: dict | None = None  # {label: weight}, training only, as in fit(class_weight=...)
    gradient_accumulation_steps: int = 1  # one update (and one all-reduce) per this many batches
    seed: int = 0
    progress_every_n_steps: int = 0  # 0: about ten progress updates per epoch, at least 2 s apart
    on_nan: Literal["stop", "ignore"] = "stop"  # a non-finite loss stops the run, naming epoch and step
    jit_compile: bool | Literal["auto"] = "auto"  # XLA for forward+backward; auto: on GPU workers only
    dtype_policy: Literal["float32", "mixed_float16", "mixed_bfloat16"] = "float32"  # Keras mixed precision
    initial_loss_scale: float = 32768.0  # mixed_float16 only: dynamic loss scaling starts here (Keras' default)
    # The gradient all-reduce sends float16/bfloat16 (half the bytes) and casts back: not exact
    gradient_compression: Literal["none", "fp16", "bf16"] = "none"
    # BatchNormalization's batch statistics: of the whole global batch (as one device), or of each
    # worker's rows with the moving statistics averaged over workers before every save (cheaper)
    batch_norm: Literal["global", "local"] = "global"
    # a loader's dataset (tf.data, PyDataset): global batches per epoch (then read on across epochs,
    # as fit does; an infinite one needs it) and per validation; None: the whole dataset
    steps_per_epoch: int | None = None
    validation_steps: int | None = None

    @property
    def loss_scale(self) -> float | None:
        """The initial dynamic loss scale when the policy needs one (float16 math), else None."""
        return self.initial_loss_scale if self.dtype_policy == "mixed_float16" else None


@dataclass
class WorkerRange:
    """`num_workers: {min: m, max: M}`: Ray Train's elastic scaling, `ScalingConfig(num_workers=(m, M))`."""

    min: int
    max: int


@dataclass
class ScalingSpec:
    """Ray's `ScalingConfig` words."""

    num_workers: int | WorkerRange = 1
    use_gpu: bool = False
    resources_per_worker: dict = field(default_factory=dict)
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    elastic_resize_monitor_interval_s: float = 60.0  # how often an elastic run looks for more room

    @property
    def elastic(self) -> bool:
        return isinstance(self.num_workers, WorkerRange)

    @property
    def min_workers(self) -> int:
        return self.num_workers.min if self.elastic else self.num_workers

    @property
    def max_workers(self) -> int:
        return self.num_workers.max if self.elastic else self.num_workers

    @property
    def described(self) -> str:
        """The worker count as people read it: 2, or 1-4 for an elastic range."""
        return f"{self.min_workers}-{self.max_workers}" if self.elastic else str(self.num_workers)


@dataclass
class RunSpec:
    """Ray's `RunConfig` words; `storage_path` defaults to `<output dir>/ray_results`."""

    storage_path: str | None = None
    collective_timeout_s: float = 600.0
    stall_warning_s: float = 60.0  # the console says what the run waits for after this long without progress; 0: off
    checkpoints_to_keep: int = 2  # Ray's CheckpointConfig(num_to_keep) for resume state
    resume_every_n_steps: int | None = None  # also resume points inside epochs (local or mounted storage)
    pip: list = field(default_factory=list)  # extra requirements for `rayparallel submit`

    @property
    def local_storage(self) -> bool:
        """A path (local or mounted on every node), not a URI such as s3://."""
        return "://" not in (self.storage_path or "")


@dataclass
class CheckpointSpec:
    """Keras `ModelCheckpoint` semantics for the base model's weights.

    `filepath` is formatted with `epoch` (1-based), `step` (global), `batch` (in the epoch)
    and any global metric of the moment, e.g. "{epoch:02d}-{val_loss:.4f}.weights.h5".
    `keep` keeps the best k files by `monitor` plus the latest; `save_freq` is "epoch" or a
    number of steps.
    """

    dir: str | None = None  # default <output dir>/checkpoints
    filepath: str = "epoch-{epoch:03d}.weights.h5"
    monitor: str = "val_loss"
    mode: Literal["auto", "min", "max"] = "auto"
    save_best_only: bool = False
    save_freq: Literal["epoch"] | int = "epoch"
    keep: int | None = None
    enabled: bool = True


@dataclass
class MlflowSpec:
    """One MLflow run per training run. `tracking_uri` defaults to `MLFLOW_TRACKING_URI`,
    else MLflow's own default (`sqlite:///mlflow.db` in the working directory);
    `experiment` defaults to the job name and `run_name` to the Ray run name."""

    enabled: bool = True
    tracking_uri: str | None = None
    experiment: str | None = None
    run_name: str | None = None
    tags: dict = field(default_factory=dict)
    register_model: str | None = None  # the best checkpoint by checkpoint.monitor is registered under this name
    register_alias: str | None = "champion"  # ... and this alias points at that version (models:/NAME@champion)
    log_checkpoints: bool = False  # each kept weight file a logged model of the run (its Models tab), step = epoch
    model_batch_size: int = 1  # the logged models are rebuilt with this batch (1: streaming)
    log_step_loss: bool = False  # also log the running train loss at each progress update
    system_metrics_interval_s: float = 10.0  # each node's CPU, memory, disk, network, GPUs; 0: off
    flush_timeout_s: float = 60.0  # at the end, how long to keep retrying an unreachable server


@dataclass
class FailureSpec:
    """Ray's `FailureConfig`: how many times a failed worker group restarts from the last
    resume checkpoint (the last completed epoch)."""

    max_failures: int = 0


@dataclass
class TuneSpec:
    """`rayparallel tune`: Ray Tune's `TuneConfig` words; `train` ignores this section.

    `params` maps a dotted spec key (anything `--set` takes) to a space: `choice(a, b)`,
    `grid(a, b)`, `uniform(lo, hi)`, `loguniform(lo, hi)` or `randint(lo, hi)`.
    """

    params: dict = field(default_factory=dict)
    samples: int | None = None  # Tune's num_samples: repeats of the grid, with fresh draws (default 1)
    max_concurrent: int | None = None  # trials at once; default: as many as the cluster holds
    metric: str | None = None  # default val_loss, or loss for a job without validation data
    mode: Literal["min", "max"] = "min"
    scheduler: Literal["fifo", "asha"] = "fifo"
    grace_period: int = 1  # ASHA: epochs every trial runs before it may be stopped
    reduction_factor: float = 4.0  # ASHA: keeps the best 1/reduction_factor at each rung
    seed: int = 0  # draws of the sampled spaces


@dataclass
class PredictSpec:
    """`rayparallel predict`: `train` ignores this section.

    `batch_size` is the rows one replica predicts per step (default: 256 rows of a stateless
    model; with `layout: streams`, all the streams a worker owns, in groups of at most this many).
    """

    batch_size: int | None = None


@dataclass
class JobSpec:
    """A whole job file. `JobSpec.per_worker_batch_size` is what each replica is built for."""

    name: str
    model: ModelSpec
    data: DataSpec
    train: TrainSpec
    scaling: ScalingSpec = field(default_factory=ScalingSpec)
    run: RunSpec = field(default_factory=RunSpec)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    mlflow: MlflowSpec = field(default_factory=MlflowSpec)
    failure: FailureSpec = field(default_factory=FailureSpec)
    tune: TuneSpec = field(default_factory=TuneSpec)
    predict: PredictSpec = field(default_factory=PredictSpec)

    @property
    def per_worker_batch_size(self) -> int:
        """Rank 0's batch at the most workers: the largest (the recorder and export build at it; weights fit any)."""
        return self.worker_batch_size(0)

    def worker_batch_size(self, rank: int, world: int | None = None) -> int:
        """Rank `rank`'s batch among `world` workers (default: the most the job runs on)."""
        start, stop = rank_rows(self.train.global_batch_size, world or self.scaling.max_workers, rank)
        return stop - start

    def worker_batch_sizes(self, world: int | None = None) -> list[int]:
        world = world or self.scaling.max_workers
        return [self.worker_batch_size(rank, world) for rank in range(world)]

    def batch_split(self, world: int | None = None) -> str:
        """The per-worker batches as people read them: "4", or "6,5,5" when they differ."""
        sizes = self.worker_batch_sizes(world)
        return str(sizes[0]) if len(set(sizes)) == 1 else ",".join(map(str, sizes))

    @property
    def possible_batch_sizes(self) -> list[int]:
        """Every per-worker batch any worker count of the job gives (an elastic run may take each)."""
        worlds = range(self.scaling.min_workers, self.scaling.max_workers + 1)
        return sorted({size for world in worlds for size in self.worker_batch_sizes(world)})

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)

    def recorded(self) -> dict[str, Any]:
        """`to_dict` as job.yaml and MLflow record it: functions by name (`references.named`)."""
        from .references import named

        return named(self.to_dict())
