"""The cart-pole recipe's mixture form, `data.mixture: [{name, root, weight, episodes}]`
(R-SCALE-3): the source it builds and the refusals of its schema. (A run over a mixture is
in docs/lerobot.md; the sampling is tested in tests/models/lerobot.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from embodichain_models.policies.cartpole_bc.data import bc_data
from embodichain_models.policies.cartpole_bc.prepare import prepare
from embodichain_models.policies.cartpole_bc.schema import BcConfig
from pydantic import ValidationError


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bc_mix")
    return (prepare(root / "a", episodes=3, seed=0, size=16),
            prepare(root / "b", episodes=3, seed=1, size=16))


def test_the_mixture_form_builds_a_weighted_source_holding_out_each_parts_episodes(
        roots) -> None:
    """Catches a recipe that ignores a part's weight or episodes, or holds out episodes of
    one part only: the source's parts are the named ones with their weights and the
    episodes left after each part's last `val_episodes`, and validation gets each part's
    held-out examples under its name."""
    a, b = roots
    config = BcConfig.model_validate({"data": {"mixture": [
        {"name": "sim", "root": str(a), "weight": 3},
        {"name": "real", "root": str(b), "weight": 1, "episodes": [0, 2]}],
        "val_episodes": 1}})
    bc = bc_data(config)
    parts = bc.source.parts
    assert parts.names == ("sim", "real") and parts.weights == (3.0, 1.0)
    assert bc.source.dataset.episodes == [("sim", 0), ("sim", 1), ("real", 0)]
    assert sorted(bc.held_out) == ["real", "sim"]
    real = bc.held_out["real"][0]
    assert real["part_index"].item() == 1
    assert bc.held_out["real"].mixture.episodes[real["episode_index"].item()] == ("real", 2)


def test_root_and_mixture_together_or_neither_are_refused(roots) -> None:
    """Catches a data section that silently prefers one of `root` and `mixture`, or accepts
    two parts of one name (their metrics would collide)."""
    a, b = roots
    part = {"name": "sim", "root": str(a)}
    for data in ({}, {"root": str(a), "mixture": [part]},
                 {"mixture": [part, {**part, "root": str(b)}]}):
        with pytest.raises(ValidationError, match="data.root|must differ"):
            BcConfig.model_validate({"data": data})
