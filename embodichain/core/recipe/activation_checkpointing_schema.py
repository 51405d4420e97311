"""`trainer.activation_checkpointing` (R-OPS-4): which module classes recompute their forward in
the backward instead of keeping their activations. Torch-free: the names are checked against
the model when the trainer is built (core/training/activation_checkpointing.py)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, StrictStr, ValidationInfo, field_validator

from embodichain.core.recipe.schema_base import Section

ClassName = Annotated[StrictStr, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class ActivationCheckpointingConfig(Section):
    """`trainer.activation_checkpointing: {modules: [ClassName, ...]}`."""

    modules: list[ClassName] = Field(min_length=1)
    """Class names (`type(module).__name__`, e.g. `TransformerEncoderLayer`) of the sub-modules
    to checkpoint; each must name a class the model has (else train-sl refuses, exit 2)."""

    @field_validator("modules")
    @classmethod
    def _each_once(cls, value: list[str]) -> list[str]:
        twice = sorted({name for name in value if value.count(name) > 1})
        if twice:
            raise ValueError(f"names {', '.join(twice)} more than once")
        return value


def _not_compiled(value: ActivationCheckpointingConfig | None, info: ValidationInfo
                  ) -> ActivationCheckpointingConfig | None:
    # torch.compile traces the forward hooks' checkpoint into graphs whose recomputation
    # torch checks against another graph, and refuses: the two are not combined.
    if value is not None and info.data.get("compile"):
        raise ValueError("not available with trainer.compile: true; set one of them off")
    return value


# The `trainer` field (declared after `trainer.compile`, which it reads).
ActivationCheckpointing = Annotated[ActivationCheckpointingConfig | None,
                                    AfterValidator(_not_compiled)]
