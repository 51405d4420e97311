"""A missing ALOHA dataset is refused with the prepare command this recipe needs: its task,
its cameras at the camera recipes' frame size, and its own data.root, parsed by prepare's
own command line as exactly that.

Catches: the generic `prepare --task TASK --episodes 50 DIR` hint (it records no camera, and
the camera recipe then fails on the missing `observation.images.top`), a hint that drops the
cameras or the size, and one that names another task or directory than the recipe's."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from embodichain_models.data.aloha import prepare
from embodichain_models.policies.act.schema import PREPARE_COMMAND, ActConfig
from embodichain_models.policies.diffusion.schema import DiffusionConfig
from pydantic import ValidationError

from tests.support.processes import REPO

EXAMPLES = REPO / "examples" / "learning" / "aloha"


def _hint(recipe: Path, root: Path) -> list[str]:
    """The command the refusal of `recipe` with `data.root: root` names, as argv."""
    loaded = yaml.safe_load(recipe.read_text())
    schema = DiffusionConfig if loaded["factory"] == "aloha_diffusion" else ActConfig
    with pytest.raises(ValidationError) as refused:
        schema.model_validate({"data": {**loaded["data"], "root": str(root)}})
    text = str(refused.value)
    assert "LeRobot dataset not found" in text
    command = text.split("record one with `", 1)[1].split("`", 1)[0]
    assert command.startswith(PREPARE_COMMAND + " ")
    return shlex.split(command)[len(PREPARE_COMMAND.split()):]


@pytest.mark.parametrize("example, task", [("transfer_cube_camera.yaml", "transfer_cube"),
                                           ("insertion_camera.yaml", "insertion"),
                                           ("transfer_cube_diffusion.yaml", "transfer_cube")])
def test_a_camera_recipe_without_its_data_names_the_camera_recording_command(
        example: str, task: str, tmp_path: Path) -> None:
    root = tmp_path / "top camera data"  # a space: the hint quotes it
    args = prepare.command_line().parse_args(_hint(EXAMPLES / example, root))
    assert (args.task, args.cameras, args.out) == (task, ["top"], root)
    assert args.size == (120, 160)  # the size the camera recipes are measured with
    assert args.episodes == 50


def test_a_state_recipe_without_its_data_names_a_recording_without_cameras(
        tmp_path: Path) -> None:
    root = tmp_path / "absent"
    args = prepare.command_line().parse_args(_hint(EXAMPLES / "insertion.yaml", root))
    assert (args.task, args.cameras, args.out) == ("insertion", [], root)
