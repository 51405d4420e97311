"""The base of every recipe section (R-CFG-1): strict, closed to unknown keys, finite.

Kept apart from `schema` so that sections defined in their own modules (the evaluation
section) and the framework schema that holds them share it without an import cycle.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

# Strict: YAML gives real types, so `batch_size: true` or `lr: "1e-3"` is a mistake, never a
# value to coerce; and only finite numbers (`.inf` / `.nan` are YAML floats too). A field that
# takes text for a non-text type (e.g. a Path) opts out with `Strict(False)`.
SECTION_CONFIG = ConfigDict(extra="forbid", validate_assignment=True, strict=True,
                            allow_inf_nan=False)


class Section(BaseModel):
    """Base of every recipe section: unknown keys are errors, types are strict (no `true` for
    a number, no `"32"` for an integer), numbers finite; assignments are re-validated.

    Torch-free on purpose: schemas built on it can be validated without importing torch.
    """

    model_config = SECTION_CONFIG
