"""What each `trainer.strategy` cannot be combined with (R-STRAT-1), read when a recipe is
validated: `validate-config` refuses exactly what `train-sl` refuses, before anything starts.

Torch-free, so validating a recipe stays fast; the strategies themselves live in
core/training/strategies/ and rely on these refusals having been made.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Unsupported(NamedTuple):
    """`trainer.<key>: <value>` cannot run under a strategy, and what to do instead."""

    key: str
    value: Any
    advice: str


UNSUPPORTED: dict[str, tuple[Unsupported, ...]] = {
    "ddp": (),
    "fsdp": (
        Unsupported("precision", "fp16", "(its gradient scaler is not sharded); use bf16 or "
                    "fp32"),
        Unsupported("compile", True, "yet; set trainer.compile: false"),
    ),
}


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)  # as YAML writes it


def strategy_problems(strategy: str, trainer: Any) -> list[str]:
    """Each `trainer.*` setting that `strategy` cannot run with, as its refusal."""
    return [f"trainer.{u.key}: {_shown(u.value)} is not available with trainer.strategy: "
            f"{strategy} {u.advice}"
            for u in UNSUPPORTED.get(strategy, ()) if getattr(trainer, u.key) == u.value]
