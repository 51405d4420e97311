"""The recipe schema: framework-owned sections, and how a factory's schema joins them (R-CFG-1).

A recipe is one YAML mapping. The framework owns `factory`, `seed`, `device`, `trainer`,
`optimizer` and `scheduler`; every other top-level section belongs to the factory, which
declares it through a `config_schema` attribute (a pydantic model or a dataclass). Both are
validated together in one pass so that every problem is reported at once (see
`recipe/loading.py` for loading and `recipe/validation_errors.py` for its error messages).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
import warnings
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    StrictInt,
    StrictStr,
    TypeAdapter,
    create_model,
    field_validator,
    model_validator,
)

from embodichain.core.recipe.activation_checkpointing_schema import ActivationCheckpointing
from embodichain.core.recipe.durations import Duration
from embodichain.core.recipe.evaluation_schema import EvaluationConfig, evaluation_problems
from embodichain.core.recipe.global_batch import global_batch_problem
from embodichain.core.recipe.logger_names import check_logger_name
from embodichain.core.recipe.profile_schema import ProfileConfig, profile_problem
from embodichain.core.recipe.schema_base import SECTION_CONFIG, Section  # noqa: F401 (re-exported)
from embodichain.core.recipe.strategy_limits import strategy_problems

with warnings.catch_warnings():  # `validate` is the recipe's word; pydantic's own
    warnings.simplefilter("ignore")  # deprecated `BaseModel.validate` is not used here

    class EmaConfig(Section):
        """`trainer.ema` (R-LOOP-2): `ema = decay * ema + (1 - decay) * params` per step."""

        decay: float = Field(gt=0.0, lt=1.0)
        validate: Literal["model", "ema", "both"] = "ema"
        """Which weights validation evaluates; `both` logs the EMA's as `validation_ema/*`."""
# -- best metric and early stop (R-MET-1, R-MET-2); their use lives in recipe/best.py --
Mode = Literal["min", "max"]


class BestConfig(Section):
    """`trainer.best`: the metric that matters and which direction is better."""

    metric: StrictStr
    """A key validation reports, e.g. `validation/accuracy`."""
    mode: Mode = "min"
    """`min`: lower is better (an error); `max`: higher is better (an accuracy)."""

    @field_validator("metric")
    @classmethod
    def _named(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("name the metric, e.g. validation/accuracy")
        return value


class EarlyStopConfig(Section):
    """`trainer.early_stop`: end the run at the validation that makes `patience` in a row
    without an improvement of the best metric by at least `min_delta`."""

    patience: PositiveInt
    min_delta: NonNegativeFloat = 0.0


class FsdpConfig(Section):
    """`trainer.fsdp` (design §13): options of `trainer.strategy: fsdp`."""

    reshard_after_forward: bool = True
    """Free each block's gathered parameters after its forward and gather them again for
    backward (less memory, one more all-gather per block)."""


class TrainerConfig(Section):
    batch_size: PositiveInt
    """Examples per worker per update; the global batch is `batch_size * world_size`."""
    max_updates: PositiveInt
    validate_every: NonNegativeInt = 0
    """Validate every N updates on rank 0 (0: never)."""
    save_every: NonNegativeInt = 0
    """Write `step_N.pt` every N updates (0: only `last.pt` at the end)."""
    log_every: PositiveInt = 10
    output_dir: str
    loggers: list[Annotated[StrictStr, AfterValidator(check_logger_name)]] = ["jsonl"]
    """Metric writers on rank 0. metrics.jsonl is always written (it is the record);
    `tensorboard` adds event files in `output_dir/tensorboard` (extra `tensorboard`), `wandb`
    a Weights & Biases run (extra `wandb`); third parties register more (R-OBS-3)."""
    save_best: bool = False
    """Keep `best.pt`, the snapshot with the best value so far of `trainer.best`."""
    keep_last: PositiveInt | None = None
    """Keep only the newest N `step_*.pt` files (default: keep all)."""
    on_nonfinite: Literal["stop", "skip"] = "stop"
    """A non-finite global loss: `stop` the run at that update (exit 1), or `skip` the
    optimizer step like a zero-weight batch (recorded as `train/skipped`)."""
    skip_guard: Literal["copy", "sync"] = "copy"
    """On a GPU, how a skipped update (zero weight, non-finite loss, fp16 overflow) is kept
    from changing the model when the optimizer has no fused `found_inf` path: `copy` keeps a
    copy of the parameters and optimizer state each update (memory, no wait), `sync` reads
    the decision on the host before the step (one wait for the GPU per update). Fused
    optimizers and CPU runs need neither; training is the same either way."""
    # -- training loops (R-LOOP-1, R-LOOP-2, R-LOOP-4): core/training/{learner,ema,precision} --
    grad_accumulation: PositiveInt = 1
    """Micro-batches of `batch_size` per worker per update; one gradient all-reduce. Under
    `global_batch_size` derived when unset (and it must agree when given)."""
    global_batch_size: PositiveInt | None = None
    """G examples per update over all ranks (null: `batch_size` per worker, as without it).
    `batch_size` is then the per-rank micro-batch and each rank runs K = G / (world size x
    batch_size) micro-batches per update; the examples of every update are the same on any
    world size (R-ELASTIC-1, R-ELASTIC-2)."""
    ema: EmaConfig | None = None
    """Keep an exponential moving average of the parameters (`{decay, validate}`)."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Autocast precision; fp16 adds a gradient scaler (CUDA only)."""
    compile: bool = False
    """Train through `torch.compile(model)`; the unwrapped model is saved and validated."""
    activation_checkpointing: ActivationCheckpointing = None
    """`{modules: [ClassName, ...]}`: recomputed in the backward (R-OPS-4; docs/recipe.md)."""
    deterministic: bool = False
    """Reproducible CUDA training, run to run and across resume: torch's deterministic
    kernels only (an operation without one stops the run), cuDNN without its autotuner, a
    fixed cuBLAS workspace and NCCL's ring algorithm. On CPU: accepted, changes nothing."""
    # Background checkpoint writes and time-based snapshots (R-CKPT-8, R-CKPT-9)
    async_save: bool = True
    """Write checkpoints on a background thread of rank 0; training pauses only for the copy
    of the state into CPU memory (`false`: write in the loop)."""
    save_every_s: PositiveFloat | None = None
    """Also write `last.pt` once this many seconds have passed since the last save."""
    collective_timeout: Duration = 300.0  # R-OPS-1: core/distributed/hang_watch.py
    """An update waiting longer for the other ranks ends the run, naming them (RUN/hang/)."""
    # -- best metric and early stop (R-MET-1, R-MET-2) --
    best: BestConfig | None = None
    """The metric behind best.pt, the summary's best, the bar and `runs`; null: the
    factory's choice (`SupervisedTrainer(best=...)`), else validation/mse, min."""
    early_stop: EarlyStopConfig | None = None
    """Stop after `patience` validations without improving the best metric (a snapshot is
    written; the run counts as complete)."""
    # -- data loading (design §11): worker processes, prefetch depth, sampling ------------
    data_workers: NonNegativeInt = 0
    """Processes of torch's DataLoader loading a `DatasetSource` (0: the training process).
    The trained model is the same for every value."""
    prefetch: PositiveInt = 2
    """Batches each data worker loads ahead."""
    sampling: Literal["with_replacement", "epochs"] = "with_replacement"
    """`with_replacement`: each rank draws independently (R-DIST-4); `epochs`: a seeded
    permutation per epoch dealt out disjointly to the ranks, the remainder dropped."""
    # -- sharding (R-SHARD-1): core/distributed/sharding.py, core/checkpoint/sharded.py --
    strategy: Literal["ddp", "fsdp"] = "ddp"
    """`ddp`: every rank holds the whole model; `fsdp`: parameters, gradients and optimizer
    state sharded over the ranks with FSDP2, each rank saving its own shard."""
    fsdp: FsdpConfig | None = None
    """Options of `strategy: fsdp` (null: the defaults)."""
    profile: ProfileConfig | None = None  # R-OPS-2: a torch.profiler trace per rank
    """`{start, updates}`: traces in `output_dir/profile/` (docs/observe.md)."""
    memory_snapshot: bool = False
    """CUDA: torch's allocator snapshot in `output_dir/memory/` at an out-of-memory error
    and at the profile's end (R-OPS-3; on CPU a warning says none is written)."""

    @field_validator("profile")
    @classmethod
    def _profile_fits(cls, value: ProfileConfig | None, info: Any) -> ProfileConfig | None:
        problem = profile_problem(value, info.data.get("max_updates"))
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _strategy_runs_these_settings(self) -> TrainerConfig:
        problems = strategy_problems(self.strategy, self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _global_batch_divides(self) -> TrainerConfig:
        # What no world size can serve is refused without knowing it (R-ELASTIC-1).
        problem = global_batch_problem(self, None)
        if problem:
            raise ValueError(problem)
        return self

    def micro_batches_per_update(self, world_size: int) -> int:
        """K: `grad_accumulation`, or under `global_batch_size` G / (world_size x batch_size)
        (ValueError when that is not a whole number >= 1 agreeing with an explicit one)."""
        if self.global_batch_size is None:
            return self.grad_accumulation
        problem = global_batch_problem(self, world_size)
        if problem:
            raise ValueError(problem)
        return self.global_batch_size // (world_size * self.batch_size)


class OptimizerConfig(Section):
    name: Literal["adam", "adamw", "sgd"]
    lr: PositiveFloat
    weight_decay: NonNegativeFloat = 0.0
    grad_clip: PositiveFloat | None = None
    """Clip the global gradient norm to this value."""
    # -- optimizer hyper-parameters and groups (R-LOOP-3): see core/training/param_groups.py --
    betas: list[Annotated[float, Field(ge=0.0, lt=1.0)]] | None = Field(
        None, min_length=2, max_length=2)
    """Adam / AdamW `[beta1, beta2]` (torch's default `[0.9, 0.999]` when omitted)."""
    eps: PositiveFloat | None = None
    """Adam / AdamW epsilon (torch's default 1e-8 when omitted)."""
    momentum: float | None = Field(None, ge=0.0, lt=1.0)
    """SGD momentum (0 when omitted)."""
    nesterov: bool = False
    """SGD Nesterov momentum (needs `momentum` > 0)."""
    no_decay: list[Literal["bias", "norm"]] = []
    """Exempt biases and/or normalisation-layer parameters from weight decay."""
    fused: bool = False
    """torch's fused kernel for the step (`fused=True`: one kernel per device and dtype;
    CPU and CUDA) instead of its default foreach arithmetic: fewer kernel launches on a
    GPU, but other roundings, so a run is bitwise reproducible and resumes exactly only
    with the setting it was trained with (changing it is refused on resume)."""

    @model_validator(mode="after")
    def _options_fit_the_optimizer(self) -> OptimizerConfig:
        problems = []
        adam_only = [k for k in ("betas", "eps") if getattr(self, k) is not None]
        if self.name == "sgd" and adam_only:
            problems.append(f"optimizer.{adam_only[0]}: applies to adam and adamw, not sgd")
        if self.name != "sgd" and (self.momentum is not None or self.nesterov):
            key = "momentum" if self.momentum is not None else "nesterov"
            problems.append(f"optimizer.{key}: applies to sgd, not {self.name}")
        elif self.nesterov and not self.momentum:
            problems.append("optimizer.nesterov: needs optimizer.momentum > 0")
        if problems:
            raise ValueError("; ".join(problems))
        return self


class SchedulerConfig(Section):
    name: Literal["constant", "linear", "cosine"] = "constant"
    end_lr: NonNegativeFloat = 0.0
    """Learning rate reached at `trainer.max_updates` (linear and cosine)."""
    warmup_updates: NonNegativeInt = 0


class FrameworkConfig(Section):
    """The framework-owned part of every recipe."""

    factory: StrictStr
    seed: StrictInt = 0
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    trainer: TrainerConfig
    optimizer: OptimizerConfig
    scheduler: SchedulerConfig | None = None
    evaluation: EvaluationConfig | None = None
    """Closed-loop episodes in a simulator at every validation (R-EVAL-1)."""

    @model_validator(mode="after")
    def _evaluation_fits(self) -> FrameworkConfig:
        problems = evaluation_problems(self.evaluation, self.trainer.ema is not None)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _precision_fits_the_device(self) -> FrameworkConfig:
        # device: auto, and bf16 on a GPU, are checked on the resolved device before training.
        if self.trainer.precision == "fp16" and self.device == "cpu":
            raise ValueError("trainer.precision: fp16 needs a CUDA device (device: cpu has no "
                             "fp16 autocast with gradient scaling); use bf16 or fp32")
        return self


# Keys that may change between a checkpoint and the run resuming from it (R-RESUME-2).
RESUMABLE_CHANGES = (
    "trainer.output_dir",
    "trainer.log_every",
    "trainer.validate_every",
    "trainer.save_every",
    "trainer.save_best",
    "trainer.keep_last",
    "trainer.loggers",  # where metrics are shown, not what is trained
    "trainer.max_updates",
    # A policy for updates that never happen in a healthy run: switching it changes nothing
    # about the finite ones, and checkpoints written before the key existed stay resumable.
    "trainer.on_nonfinite",
    "trainer.skip_guard",  # how a skip is applied, not what is trained
    "trainer.ema.validate",  # which weights are evaluated, not what is trained
    # How and how often snapshots are written, not what is trained (R-CKPT-8, R-CKPT-9).
    "trainer.async_save",
    "trainer.save_every_s",
    "trainer.collective_timeout",  # when a hang is declared, not what is trained (R-OPS-1)
    # What counts as best is read off the history, not trained on (R-MET-1); a patience may
    # only be raised (config_differences refuses a lower one).
    "trainer.best",
    "trainer.early_stop.patience",
    # How batches are loaded, not which: the same batches come for any value (R-DATA-1).
    "trainer.data_workers",
    "trainer.prefetch",
    "trainer.fsdp",  # reshard_after_forward: memory against communication, same update
    "trainer.activation_checkpointing",  # memory against time, the same update (R-OPS-4)
    # Which kernels compute the same update, not what is trained: on CPU nothing changes; on
    # CUDA a run continued with another value is float-close to the uninterrupted one, no
    # longer bitwise (run.json's `resumed` event records the value each resume ran with).
    "trainer.deterministic",
    # How the policy is judged in closed loop, not what is trained (R-EVAL-1).
    "evaluation",
    "trainer.profile",  # what is recorded about updates, not what they compute (R-OPS-2)
    "trainer.memory_snapshot",
)

def is_resumable_change(key: str) -> bool:
    """A flattened key (`trainer.best.mode`) that may differ on resume: a listed key or one
    inside a listed section."""
    return any(key == k or key.startswith(k + ".") for k in RESUMABLE_CHANGES)


# -- defaults read off a schema (R-RESUME-2: a key newer than a checkpoint, at its default) --
NO_DEFAULT: Any = object()  # the key is unknown to the schema, or required there


def default_at(schema: Any, dotted: str) -> Any:
    """The default of the dotted key `dotted` (`data.train_episodes`) in `schema` (a pydantic
    model or a dataclass, sections nested), in resolved JSON form, or NO_DEFAULT.

    Read off the schema itself (field defaults, default factories, nested sections), so a
    schema author states a new key's default in one place."""
    *parents, leaf = dotted.split(".")
    node = schema
    for part in parents:
        field = _fields_of(node).get(part)
        node = _section_type(field[0]) if field is not None else None
        if node is None:  # not a section: what lies below it has no default of its own
            return NO_DEFAULT
    annotation, default = _fields_of(node).get(leaf, (None, NO_DEFAULT))
    if default is NO_DEFAULT:
        return NO_DEFAULT
    try:  # the form resolved_dict gives: a model, dataclass or Path as plain data
        return TypeAdapter(annotation).dump_python(default, mode="json")
    except Exception:  # an annotation pydantic cannot adapt: the value as it is
        return default


def _fields_of(node: Any) -> dict[str, tuple[Any, Any]]:
    """`name -> (annotation, default or NO_DEFAULT)` of a model or dataclass, else `{}`."""
    if isinstance(node, type) and issubclass(node, BaseModel):
        return {name: (f.annotation, NO_DEFAULT if f.is_required()
                       else f.get_default(call_default_factory=True))
                for name, f in node.model_fields.items()}
    if isinstance(node, type) and dataclasses.is_dataclass(node):
        hints = typing.get_type_hints(node, include_extras=False)
        found = {}
        for f in dataclasses.fields(node):
            default = (f.default if f.default is not dataclasses.MISSING else
                       f.default_factory() if f.default_factory is not dataclasses.MISSING
                       else NO_DEFAULT)
            found[f.name] = (hints.get(f.name, Any), default)
        return found
    return {}


def _section_type(annotation: Any) -> Any:
    """The section (model or dataclass) an annotation holds, `X | None` included, or None."""
    if typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    args = typing.get_args(annotation) or (annotation,)
    sections = [a for a in args if isinstance(a, type)
                and (issubclass(a, BaseModel) or dataclasses.is_dataclass(a))]
    return sections[0] if len(sections) == 1 else None


def resolved_dict(config: BaseModel) -> dict[str, Any]:
    """The recipe as plain JSON-able data, defaults filled in."""
    return config.model_dump(mode="json")


def config_sha256(resolved: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(resolved).encode()).hexdigest()


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def flatten_keys(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}`; empty sections stay as `{}` values."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten_keys(value, name + "."))
        else:
            flat[name] = value
    return flat


_COMBINED: dict[Any, type[BaseModel]] = {}
# The whole recipe is not strict at its top level: a factory's own top-level fields keep the
# factory's choice (a dataclass `path: Path` must take YAML text). The framework's fields are
# strict by their types, its sections by `Section`; the recipe check refuses `true` for a
# number and non-finite numbers in every schema (recipe/loading.py).
_COMBINED_CONFIG = ConfigDict(extra="forbid", validate_assignment=True, strict=False,
                              allow_inf_nan=False)


class _CombinedBase(FrameworkConfig):
    model_config = _COMBINED_CONFIG


def combined_schema(recipe_schema: Any) -> type[BaseModel]:
    """One model for the whole recipe: the factory's sections plus the framework's.

    A pydantic schema is combined by inheritance, so its top-level validators see the
    framework fields too (e.g. `self.device`). A dataclass schema contributes its fields.
    """
    if recipe_schema is None:
        return FrameworkConfig
    if recipe_schema in _COMBINED:
        return _COMBINED[recipe_schema]
    if isinstance(recipe_schema, type) and issubclass(recipe_schema, BaseModel):
        combined = type(f"{recipe_schema.__name__}Recipe", (recipe_schema, FrameworkConfig),
                        {"model_config": _COMBINED_CONFIG})
    elif dataclasses.is_dataclass(recipe_schema):
        hints = typing.get_type_hints(recipe_schema)
        fields: dict[str, Any] = {}
        for f in dataclasses.fields(recipe_schema):
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                default = ...
            fields[f.name] = (hints[f.name], default)
        combined = create_model(f"{recipe_schema.__name__}Recipe", __base__=_CombinedBase,
                                **fields)
    else:
        raise TypeError(f"config_schema must be a pydantic model or a dataclass, "
                        f"got {recipe_schema!r}")
    _COMBINED[recipe_schema] = combined
    return combined
