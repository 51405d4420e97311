"""The cart-pole recipe's mixture form, `data.mixture: [{name, root, weight, episodes}]`
(R-SCALE-3): the source it builds and the refusals of its schema. (A run over a mixture is
in docs/lerobot.md; the sampling is tested in tests/models/lerobot.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from embodichain_models.data.cartpole.prepare import prepare
from embodichain_models.policies.cartpole_bc.data import bc_data
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


@pytest.mark.slow  # a two-update train-sl run, then the held-out examples decoded again
def test_a_mixture_run_validates_each_part_on_its_own_held_out_episodes(roots, tmp_path: Path
                                                                       ) -> None:
    """A two-update run over a mixture of two datasets (different seeds, so their errors
    differ) records `validation/sim/action_mse` and `validation/real/action_mse`, each the
    policy's error on that part's held-out episode, and `validation/action_mse` on both
    parts' held-out examples together: recomputed here from last.pt (the validated weights)
    and the recipe's own held-out data. Catches the per-part metrics missing, named after
    the wrong part, computed on every part's examples, or on training episodes."""
    import json

    import yaml
    from embodichain_models.policies.cartpole_bc.policy import objective

    from embodichain.core.checkpoint.file import read_checkpoint
    from embodichain.learning.sl import load_recipe
    from tests.support import assert_ok, run_cli

    a, b = roots
    recipe = tmp_path / "mixture.yaml"
    recipe.write_text(yaml.safe_dump({
        "factory": "cartpole_bc", "seed": 0, "device": "cpu",
        "trainer": {"batch_size": 8, "max_updates": 2, "validate_every": 2,
                    "save_every": 2, "log_every": 1, "data_workers": 0,
                    "output_dir": str(tmp_path / "run"),
                    # no closed loop here (no `evaluation` section): the held-out error
                    "best": {"metric": "validation/action_mse", "mode": "min"}},
        "optimizer": {"name": "adam", "lr": 0.01},
        "model": {"channels": 4, "hidden": 16},
        "data": {"mixture": [{"name": "sim", "root": str(a), "weight": 3},
                             {"name": "real", "root": str(b), "weight": 1}],
                 "val_episodes": 1, "frames": 2, "chunk": 4},
        "validation": {"max_examples": 100000}}))  # every held-out example
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress"))
    recorded = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").open()
                if "validation/action_mse" in line]
    assert [r["step"] for r in recorded] == [2]
    recorded = recorded[0]

    config = load_recipe(recipe).config
    trainer = load_recipe(recipe).factory(config, torch.device("cpu"))
    model = trainer.model
    model.load_state_dict(read_checkpoint(tmp_path / "run/last.pt")["payload"]["learner"]
                          ["model"])
    model.eval()
    held_out = bc_data(config).held_out
    assert sorted(held_out) == ["real", "sim"]
    batches = {name: torch.utils.data.default_collate([part[i] for i in range(len(part))])
               for name, part in held_out.items()}
    batches["all"] = {k: torch.cat([batches["sim"][k], batches["real"][k]])
                      for k in batches["sim"]}
    with torch.no_grad():
        expected = {name: objective(model, batch).loss.item() for name, batch in batches.items()}
    for name in ("sim", "real"):
        assert recorded[f"validation/{name}/action_mse"] == pytest.approx(expected[name],
                                                                          rel=1e-4), name
    assert recorded["validation/action_mse"] == pytest.approx(expected["all"], rel=1e-4)
    # the parts' errors differ enough that a swap or a shared value would show
    assert abs(expected["sim"] - expected["real"]) > 0.05 * max(expected.values()), expected
    trainer.close()


def _mixture_recipe(path: Path, roots, **part1: object) -> Path:
    import yaml

    a, b = roots
    path.write_text(yaml.safe_dump({
        "factory": "cartpole_bc", "seed": 0, "device": "cpu",
        "trainer": {"batch_size": 4, "max_updates": 2, "validate_every": 0, "save_every": 2,
                    "log_every": 1, "output_dir": str(path.parent / "run")},
        "optimizer": {"name": "adam", "lr": 0.001},
        "data": {"mixture": [{"name": "sim", "root": str(a)},
                             {"name": "real", "root": str(b), **part1}],
                 "val_episodes": 1}}))
    return path


def test_set_reaches_an_item_of_a_list_of_sections(roots, tmp_path: Path) -> None:
    """`--set data.mixture.1.weight=2` (the syntax the messages print) changes the second
    part's weight, typed by its schema; an index past the list's end is refused naming the
    list and its indices. Catches `--set` that refuses a list ("not a section") or writes
    a key "1" into it."""
    import yaml

    from tests.support.cli import invoke

    recipe = _mixture_recipe(tmp_path / "r.yaml", roots)
    shown = invoke("train-sl", "--config", str(recipe), "--print-config", "--set",
                   "data.mixture.1.weight=2", "--set", "data.mixture.0.name=synthetic")
    assert shown.exit_code == 0, shown.output
    text = shown.stdout[shown.stdout.index("factory"):]
    parts = yaml.safe_load(text)["data"]["mixture"]
    assert parts[1]["weight"] == 2 and parts[1]["name"] == "real"
    assert parts[0]["name"] == "synthetic" and parts[0].get("weight", 1) == 1
    bad = invoke("validate-config", str(recipe), "--set", "data.mixture.2.weight=2")
    assert bad.exit_code == 2
    said = " ".join(bad.stderr.split())
    assert "data.mixture is a list of 2 item(s); name one by its index 0..1" in said, said


def test_a_misspelt_key_inside_a_list_item_gets_a_did_you_mean(roots, tmp_path: Path
                                                                 ) -> None:
    """`wieght` in a mixture part is refused with "did you mean 'weight'" (rough edge of
    issue 40). Catches the suggestion looked up only in sections, never in a list's items."""
    from tests.support.cli import invoke

    recipe = _mixture_recipe(tmp_path / "r.yaml", roots, wieght=2)
    bad = invoke("validate-config", str(recipe))
    assert bad.exit_code == 2
    said = " ".join(bad.stderr.split())
    assert "data.mixture.1.wieght: unknown key (did you mean 'weight'" in said, said
    again = invoke("validate-config", str(_mixture_recipe(tmp_path / "s.yaml", roots)),
                   "--set", "data.mixture.1.wieght=2")
    assert again.exit_code == 2 and "did you mean 'weight'" in again.stderr, again.stderr


def _at_fps(root: Path, fps: int) -> Path:
    """Three cart-pole demonstrations written at `fps` (the frames are the 30 Hz ones: only
    the rate recorded in the metadata differs)."""
    from embodichain_models.data.cartpole.prepare import NOISE, demonstrations, features
    from embodichain_models.data.lerobot.writer import write_dataset

    return write_dataset(root, demonstrations(3, 2, 16, NOISE), features(16), fps,
                         episodes_per_file=25, robot_type="cartpole")


def test_parts_of_different_fps_are_served_at_their_own_fps_whatever_their_order(
        roots, tmp_path: Path) -> None:
    """A 60 fps part listed first and a 30 fps part: windows are the policy's seconds
    (frames 1/30 s apart), so the 60 fps part serves every other frame and the 30 fps part
    every frame, in either order; a 15 fps part cannot serve 1/30 s and is refused naming
    the part, its root, the key and its fps (issue 40). Catches windows taken from the
    first part's fps (this order was refused, the other served the 60 fps part's frames
    1/60 s apart) and a refusal that names neither the part nor its root."""
    from embodichain_models.data.lerobot.dataset import LeRobotFrames
    from embodichain_models.data.lerobot.errors import LeRobotFormatError

    fast, slow = _at_fps(tmp_path / "fast", 60), _at_fps(tmp_path / "slow", 15)
    a, _ = roots

    def mixture(*parts: tuple[str, Path]) -> object:
        return bc_data(BcConfig.model_validate({"data": {
            "mixture": [{"name": n, "root": str(r)} for n, r in parts],
            "val_episodes": 1, "chunk": 3, "frames": 2}})).source.dataset

    for order in ((("fast", fast), ("thirty", a)), (("thirty", a), ("fast", fast))):
        mixed = mixture(*order)
        where = [n for n, _ in order].index("fast")
        start = sum(len(d) for d in mixed.datasets[:where])
        frames = LeRobotFrames(fast)  # one frame per example, unnormalised
        first = mixed.datasets[where][0]
        assert torch.equal(first["action"], torch.stack(
            [frames[i]["action"] for i in (0, 2, 4)]))
        assert mixed[start]["part_index"].item() == where
    with pytest.raises(LeRobotFormatError) as refused:
        mixture(("thirty", a), ("slow", slow))
    said = str(refused.value)
    assert f"data.mixture part 'slow' ({slow})" in said, said
    assert "delta_timestamps['observation.image']" in said
    assert "fps 15" in said
