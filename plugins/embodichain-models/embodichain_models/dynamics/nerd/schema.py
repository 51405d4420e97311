"""The NeRD recipe's own sections, validated together with the framework's (R-CFG-1).

The framework combines `NerdConfig` with its own config by inheritance, so the top-level
validator below also sees `device`, `trainer`, `optimizer`, ...

No torch at import: this module is registered in the entry-point group
`embodichain.sl_schemas`, so checking a recipe (`validate-config`) stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    Strict,
    model_validator,
)

from embodichain.learning.sl import Section

PREPARE_COMMAND = "python -m embodichain_models.dynamics.nerd.prepare --out DIR"


def _existing_file(path: Path) -> Path:
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "file not found"
        raise ValueError(f"{what}: {str(path)!r} (create the dataset with `{PREPARE_COMMAND}`)")
    return path


# Strict(False): YAML gives the path as text.
DataFile = Annotated[Path, Strict(False), AfterValidator(_existing_file)]


def _cuda_available() -> bool:
    import torch  # only for fp16 with device: auto, so that validation stays torch-free

    return torch.cuda.is_available()


class ModelSection(Section):
    layers: PositiveInt = 2
    d_model: PositiveInt = 64
    heads: PositiveInt = 4
    window: PositiveInt = 10
    """History length in frames: the context grows to it, then slides."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelSection:
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by heads ({self.heads})")
        return self


class DataSection(Section):
    train: DataFile
    """Training split written by the prepare command (`train.pt`)."""
    val: DataFile
    """Validation split (`val.pt`), evaluated on rank 0."""
    mmap: bool = True
    """Memory-map the files: ranks on one node then share the pages instead of copying."""


class AttentionSection(Section):
    causal: bool = True


class LossSection(Section):
    mask: Literal["all_positions", "last_position"] = "all_positions"
    """Which positions of each window are supervised."""


class NormalizationSection(Section):
    eps: PositiveFloat = 1e-5
    """Added to the variances of the training-split statistics before the square root."""


class ValidationSection(Section):
    horizons: list[PositiveInt] = Field(default_factory=lambda: [1, 10, 50, 100])
    """Rollout horizons (frames); those longer than the validation trajectories are skipped."""
    max_trajectories: PositiveInt | None = None
    """Evaluate on the first N validation trajectories only (default: all)."""


class NerdConfig(BaseModel):
    """Recipe-owned sections of the NeRD cart-pole recipe."""

    model_config = ConfigDict(extra="forbid")

    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Deprecated alias of the framework's `trainer.precision`: a value other than fp32 is
    copied there (setting both to different non-fp32 values is an error)."""
    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection
    attention: AttentionSection = Field(default_factory=AttentionSection)
    loss: LossSection = Field(default_factory=LossSection)
    normalization: NormalizationSection = Field(default_factory=NormalizationSection)
    validation: ValidationSection = Field(default_factory=ValidationSection)

    @model_validator(mode="after")
    def _check_combinations(self) -> NerdConfig:
        problems = []
        if not self.attention.causal and self.loss.mask == "all_positions":
            problems.append(
                "attention.causal: false with loss.mask: all_positions leaks the answer: the "
                "target of position t (the change from state t to t+1) is in the input of "
                "position t+1, which non-causal attention lets position t see; use "
                "attention.causal: true, or loss.mask: last_position")
        # `device` and `trainer` exist once combined with the framework's config.
        device = getattr(self, "device", None)
        trainer = getattr(self, "trainer", None)
        if trainer is not None and self.precision != "fp32":
            if trainer.precision == "fp32":
                trainer.precision = self.precision  # the deprecated alias (R-LOOP-4)
            elif trainer.precision != self.precision:
                problems.append(
                    f"precision: {self.precision} (deprecated; use trainer.precision) "
                    f"contradicts trainer.precision: {trainer.precision}")
        precision = trainer.precision if trainer is not None else self.precision
        if precision == "fp16" and (device == "cpu" or device == "auto"
                                    and not _cuda_available()):
            where = "device: cpu" if device == "cpu" else "device: auto, with no CUDA device here"
            problems.append(
                f"trainer.precision: fp16 is not supported on CPU ({where}): there is no fp16 "
                "autocast and gradient scaling there; use bf16 or fp32, or a CUDA device")
        if problems:
            raise ValueError("; ".join(problems))
        return self
