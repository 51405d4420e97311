"""Durations in a recipe: seconds as a number, or text with a unit ("90s", "5m", "1h")."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
_TEXT = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([smh]?)\s*")


def seconds_of(value: Any) -> float:
    """`value` in seconds: a positive number, or a number followed by s, m or h."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (match := _TEXT.fullmatch(value)):
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    else:
        raise ValueError(f"expected a duration: seconds, or text such as '90s', '5m' or "
                         f"'1h', got {value!r}")
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"expected a positive duration, got {value!r}")
    return seconds


Duration = Annotated[float, BeforeValidator(seconds_of)]
"""A positive duration in seconds (see `seconds_of` for what a recipe may write)."""
