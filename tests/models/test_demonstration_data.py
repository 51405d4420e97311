"""The data section the demonstration policies share (policies/demonstrations.py): each
recipe's dataset roots say only where the data lies (LOCATES_DATA), and a missing root is
refused naming that recipe's own prepare command.

Catches: ALOHA's `data.root` not marked LOCATES_DATA (as before the shared section: a
resumed ALOHA run whose identical dataset moved was refused as a changed recipe, where the
cart-pole recipe's resumed), and a root check naming another recipe's prepare command."""

from __future__ import annotations

from pathlib import Path

import pytest
from embodichain_models.policies.act import schema as aloha
from embodichain_models.policies.cartpole_bc import schema as cartpole
from pydantic import ValidationError

from embodichain.core.recipe.data_location import locates_data


@pytest.mark.parametrize("schema, keys", [
    (aloha.ActConfig, ["data.root"]),
    (cartpole.BcConfig, ["data.root", "data.mixture.0.root"]),
])
def test_every_dataset_root_locates_data_and_nothing_else_does(schema: type,
                                                               keys: list[str]) -> None:
    data = schema.model_fields["data"].annotation
    for key in keys:
        assert locates_data(schema, key), key
    for name in data.model_fields:
        assert locates_data(schema, f"data.{name}") == (f"data.{name}" in keys), name


@pytest.mark.parametrize("module, config", [(aloha, "ActConfig"), (cartpole, "BcConfig")])
def test_a_missing_root_names_its_own_prepare_command(module: object, config: str,
                                                      tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as refused:
        getattr(module, config).model_validate({"data": {"root": str(tmp_path / "absent")}})
    text = str(refused.value)
    assert "LeRobot dataset not found" in text and str(tmp_path / "absent") in text
    assert module.PREPARE_COMMAND in text  # type: ignore[attr-defined]
