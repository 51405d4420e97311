"""The cart-pole behaviour-cloning recipe's own sections (no torch at import: registered in
`embodichain.sl_schemas`, so `validate-config` stays fast)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator

from embodichain.learning.sl import Section
from embodichain_models.policies.demonstrations import DemonstrationData, dataset_root

PREPARE_COMMAND = "python -m embodichain_models.data.cartpole.prepare --out DIR"


DatasetRoot = dataset_root(PREPARE_COMMAND)


class ModelSection(Section):
    channels: PositiveInt = 32
    """Channels of the image encoder's convolutions."""
    hidden: PositiveInt = 256


class MixturePart(Section):
    """One dataset of a mixture (`data.mixture`)."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")]
    """Names its metrics: `train/examples/<name>`, `validation/<name>/action_mse`."""
    root: DatasetRoot
    weight: PositiveFloat = 1.0
    """Examples are drawn from it with probability weight / (sum of the weights)."""
    episodes: list[int] | None = None
    """Its episodes to use (default all); the last `data.val_episodes` are held out."""
    rename: dict[str, str] = Field(default_factory=dict)
    """Its feature names mapped to the recipe's: `{their_key: our_key}`."""


class DataSection(DemonstrationData):
    root: DatasetRoot | None = None
    """The LeRobot v3.0 dataset written by the prepare command (or `mixture`)."""
    mixture: list[MixturePart] | None = Field(default=None, min_length=1)
    """Several datasets mixed by weight, instead of `root`; windows are in seconds at the
    policy's 30 Hz control rate, and each part serves them at its own fps (a part whose fps
    cannot take them whole is refused, naming it, its root, the key and its fps)."""
    normalization: Literal["per_part", "pooled"] = "pooled"
    """A mixture's action normalisation: each part's own statistics, or pooled across the
    parts (count-weighted). The policy's forces use the pooled (or the first part's)."""
    val_episodes: PositiveInt = 10
    """The last N episodes are held out (at least one: their action error is validated)."""
    frames: PositiveInt = 2
    """Camera frames per example, the last one current (two show the motion)."""
    tolerance_s: float = Field(default=1e-4, gt=0)
    """How far a video frame's timestamp may lie from the one asked for, seconds."""

    @model_validator(mode="after")
    def _one_source(self) -> DataSection:
        if (self.root is None) == (self.mixture is None):
            raise ValueError("give data.root (one dataset) or data.mixture (a list of "
                             "{name, root, weight, episodes}), not both or neither")
        if self.mixture is not None:
            names = [p.name for p in self.mixture]
            if len(set(names)) != len(names):
                raise ValueError(f"data.mixture: part names must differ, got {names}")
        return self


class ValidationSection(Section):
    """The held-out action error, and how the policy acts in closed loop (the episodes
    themselves: the recipe's `evaluation` section)."""

    execute: PositiveInt = 1
    """Forces of each predicted chunk applied before the policy looks again."""
    max_examples: PositiveInt = 512
    """Held-out frames whose action error is measured (evenly spaced)."""


class BcConfig(BaseModel):
    """Recipe-owned sections of the cart-pole behaviour-cloning recipe."""

    model_config = ConfigDict(extra="forbid")

    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection
    validation: ValidationSection = Field(default_factory=ValidationSection)
