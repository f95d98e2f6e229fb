"""The typed sections of a job config, and the `tracking:` section of the sweep and serve configs: pydantic
dataclasses that check types, ranges and unknown keys.

This module imports nothing of `pipelines` and no torch; `pipelines.config.load` is the entry that merges the
sources, checks the cross-field rules and resolves the defaults.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, PositiveInt
from pydantic.dataclasses import dataclass

from capt.methods import METHODS
from capt.tasks.config import DataConfig
from capt.tasks.registry import TASK_NAMES

METHOD_NAMES = tuple(METHODS)
"""The adaptation methods the shipped registry holds (`capt.methods.METHODS`), in registry order."""
STRICT = ConfigDict(extra="forbid", use_attribute_docstrings=True)
"""Every config section: unknown keys refused, each field documented by its docstring."""
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]
"""A seed, at most the largest that every generator the job seeds accepts (numpy's: 2**32 - 1): checked when the config
is read, not when Ray has started the trial that would fail on it."""
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
"""A finite float above 0 (an infinite learning rate would pass `gt=0` and turn the first loss into nan)."""
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""A finite float of at least 0."""
MAX_GENERATED_ROWS = 1_000_000
"""Most rows a generated train split may have: larger than any real task's (MultiRC's 27k) by far, small enough to
generate in seconds (a size of 10**11 would run for days before the first step)."""
LM_HEAD = "lm_head"
"""The readout of T5 and decoder-only models: the label word from the language-model head."""


@dataclass(config=STRICT)
class ModelSection:
    """Which frozen base model to adapt."""

    name: str = "tiny-t5"
    """Built-in offline model (tiny-t5, tiny-llama, tiny-qwen2, tiny-bert, minilm, smollm2-135m), a hub id or a local
    path."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Dtype the frozen weights are loaded in (trainable weights stay float32)."""
    max_length: PositiveInt = 256
    """Input tokens per example, capsule slots or virtual tokens included."""
    max_new_tokens: PositiveInt = 10
    """Tokens generated per example by the paper's evaluation protocol."""
    readout: Literal["pooler", "cls", "mean", "capsule", "lm_head"] | None = None
    """What the classifier reads (pipelines/config/load.py): encoder-only heads read pooler ([CLS] through the
    pooler), cls, mean (token states) or capsule (CaPT's slot); T5 and decoder-only models lm_head; None: the
    family's default, filled in by pipelines.config.load."""


@dataclass(config=STRICT)
class TaskSection:
    """Which task, and where its data comes from."""

    name: Literal[TASK_NAMES] = "rte"
    """Task name."""
    source: Literal["hub", "local", "generated"] = "local"
    """Data source: the hub (datasets), a local directory, or small data the project generates."""
    data_dir: str | None = None
    """Local data directory in the official jsonl layout (default: env CAPT_DATA_DIR)."""
    validation_fraction: float = Field(0.1, gt=0.0, lt=1.0)
    """Share of the official train split held out (stratified) for validation."""
    max_train_examples: PositiveInt | None = None
    """Optional seeded subsample of the training split."""
    max_eval_examples: PositiveInt | None = None
    """Optional seeded subsample of the validation and test splits."""
    generated_size: int = Field(200, ge=1, le=MAX_GENERATED_ROWS)
    """Rows per generated train split (source=generated)."""
    input_format: Literal["capt", "t5_superglue"] = "capt"
    """How examples are rendered: this project's templates, or T5's own SuperGLUE format (T5 models only;
    capt/tasks/input_formats.py)."""

    def data_config(self, seed: int) -> DataConfig:
        """The `capt.tasks.DataConfig` of this section, split with `seed` (no data_dir: CAPT_DATA_DIR's)."""
        shared = {f.name for f in dataclasses.fields(DataConfig)} - {"seed"}  # input_format is the collator's
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name in shared}
        if not fields["data_dir"]:
            del fields["data_dir"]  # DataConfig's default reads the environment
        return DataConfig(**fields, seed=seed)


def _registered_method(name: str) -> str:
    """`name` when the method registry holds it now (a method registered at run time counts)."""
    if name not in METHODS:
        raise ValueError(f"Input should be {', '.join(repr(m) for m in METHODS)}")
    return name


@dataclass(config=STRICT)
class MethodSection:
    """The adaptation method and its own options."""

    name: Annotated[str, AfterValidator(_registered_method)] = "capt"
    """Method: CaPT or one of the paper's baselines (any name in `capt.methods.METHODS`)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Options of that method only (capt: CapsuleConfig fields; baselines: their config fields)."""


@dataclass(config=STRICT)
class OptimSection:
    """Optimiser and schedule."""

    name: Literal["adafactor", "adamw"] | None = None
    """Optimiser; None: the default of the method and model family (pipelines/config/load.py), filled
    in by pipelines.config.load."""
    lr: PositiveFloat | None = None
    """Learning rate; None: the default of the method and model family (pipelines/config/load.py),
    filled in by pipelines.config.load."""
    head_lr: PositiveFloat = 1e-3
    """Learning rate of the linear head of encoder-only classifiers."""
    weight_decay: NonNegativeFloat = 0.0
    """Decoupled weight decay."""
    schedule: Literal["linear", "constant"] = "linear"
    """After warm-up: linear decay to 0 at the last step, or a constant lr."""
    warmup_ratio: float = Field(0.06, ge=0.0, lt=1.0)
    """Share of the total steps spent in linear warm-up."""
    max_grad_norm: PositiveFloat | None = 1.0
    """Gradient clipping norm (None: no clipping)."""


@dataclass(config=STRICT)
class TrainSection:
    """Loop, evaluation, precision and checkpointing."""

    batch_size: PositiveInt = 32
    """Global batch size (split across processes)."""
    eval_batch_size: PositiveInt = 64
    """Global batch size for evaluation."""
    grad_accum_steps: PositiveInt = 1
    """Gradient accumulation steps per optimiser step."""
    max_epochs: PositiveInt = 50
    """Upper bound on epochs."""
    max_steps: PositiveInt | None = None
    """Upper bound on optimiser steps (None: epochs decide)."""
    eval_every_steps: PositiveInt | None = None
    """Validate every N optimiser steps (None: after every epoch)."""
    patience: PositiveInt | None = 10
    """Stop after this many validations without improvement (None: never stop early)."""
    eval_mode: Literal["generate", "rank"] = "generate"
    """Paper protocol (generate, normalise, map to a label) or rank classification."""
    precision: Literal["auto", "no", "bf16", "fp16"] = "auto"
    """Mixed precision; auto is bf16 on GPUs and none on CPUs."""
    checkpoint_every_steps: PositiveInt | None = None
    """Save resumable state every N steps (None: at every validation)."""
    resume: bool = False
    """Continue from the latest checkpoint in output_dir."""
    overwrite: bool = False
    """Delete the outputs of another config found in output_dir instead of refusing to start."""
    log_every_steps: PositiveInt = 10
    """Report the running training loss every N steps."""
    cpu: bool = False
    """Run on CPU even when GPUs are visible."""
    eval_test_each_validation: bool = True
    """Also score the test split at each new best validation (so the test score is the best checkpoint's)."""
    score_untrained: bool = False
    """Also score the test split once before the first training step (result metric test_untrained_score)."""


@dataclass(config=STRICT)
class JobConfig:
    """One training job: (task, model, method, seed, hyper-parameters)."""

    model: ModelSection = Field(default_factory=ModelSection)
    """Base model."""
    task: TaskSection = Field(default_factory=TaskSection)
    """Task and data."""
    method: MethodSection = Field(default_factory=MethodSection)
    """Method and its options."""
    optim: OptimSection = Field(default_factory=OptimSection)
    """Optimiser and schedule."""
    train: TrainSection = Field(default_factory=TrainSection)
    """Training loop."""
    seed: Seed = 0
    """Seed of everything: data split, initialisation, shuffling, dropout."""
    output_dir: str | None = None
    """Where checkpoints, the artifact and result.json go (default: outputs/<task>/<model>/<method>/s<seed>)."""

    def resolved_output_dir(self) -> Path:
        """`output_dir`, or the default derived from task, model, method and seed."""
        if self.output_dir:
            return Path(self.output_dir)
        return Path("outputs") / self.task.name / model_slug(self.model.name) / self.method.name / f"s{self.seed}"

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (JSON/YAML ready)."""
        return dataclasses.asdict(self)


@dataclass(config=STRICT)
class ResolvedJobConfig(JobConfig):
    """A `JobConfig` with every default filled in (optimiser, lr, readout): what `pipelines.config.load` returns
    and everything below it takes. Built only there."""


def require_resolved(config: Any, where: str) -> ResolvedJobConfig:
    """`config` itself when it came from `load_job_config` / `validate_job_config`; TypeError naming `where` else
    (a hand-built `JobConfig` would train with defaults nothing logged or hashed)."""
    if isinstance(config, ResolvedJobConfig) and None not in (config.optim.name, config.optim.lr,
                                                                config.model.readout):
        return config
    raise TypeError(f"{where} takes the resolved config that pipelines.config.load_job_config or "
                    f"validate_job_config returns, not a {type(config).__name__} (build it with "
                    "validate_job_config(config.to_dict())).")


def warmup_steps(config: JobConfig, total_steps: int) -> int:
    """Optimiser steps of linear warm-up: `optim.warmup_ratio` of the total, rounded down."""
    return int(config.optim.warmup_ratio * total_steps)


@dataclass(config=STRICT)
class TrackingSection:
    """The `tracking:` section (MLflow settings), shared by the entry points that talk to MLflow (`pipelines/sweep.py`,
    `pipelines.serve`)."""

    enabled: bool = True
    """Track the sweep in MLflow (false: Tune's own results only, no server)."""
    uri: str | None = None
    """Tracking server (default: env MLFLOW_TRACKING_URI, else a local server the sweep starts)."""
    experiment: str | None = None
    """Experiment name (default: capt-<sweep name>)."""
    register: bool = True
    """Register every finished capsule in the Model Registry."""
    retry_s: PositiveFloat = 30.0
    """How long a worker, or the sweep for its own run, retries an unreachable server before keeping the call for
    `sync` / --resume (a trial's run) or going on without it (the sweep's run)."""
    promote: bool = True
    """At the end, give the best version per (model, task) the alias champion."""
    local_dir: str = "outputs/mlflow"
    """Where the local server keeps its SQLite database and artifacts."""
    system_metrics_interval_s: PositiveFloat = 10.0
    """Seconds between system metric samples (CPU, memory, GPU) of a run; short runs want a short interval."""


def model_slug(name: str) -> str:
    """A registry-safe short name: `google-t5/t5-base` -> `t5-base`, `/data/my model` -> `my-model`."""
    tail = name.rstrip("/").split("/")[-1]
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in tail).lower()


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}` (for MLflow params and override lists)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def raw_value(raw: dict[str, Any], key: str) -> Any:
    """The value of `key` ("seed" or "section.field") in a raw, unvalidated job dict, or the schema's default
    when it is absent (so cross-field checks never repeat a default; a section that is not a mapping counts as
    absent: the schema reports it)."""
    name, _, leaf = key.partition(".")
    if not leaf:
        return raw.get(name, getattr(_DEFAULTS, name))
    section = raw.get(name) if isinstance(raw.get(name), dict) else {}
    return section.get(leaf, getattr(getattr(_DEFAULTS, name), leaf))


_DEFAULTS = JobConfig()
