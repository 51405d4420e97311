"""How a changed list of sections is named when a resume is refused (issue 40)."""

from __future__ import annotations

from embodichain.core.runs.config_compat import config_differences

BASE = {"trainer": {"max_updates": 10},
        "data": {"mixture": [{"name": "sim", "root": "/d/sim", "weight": 1.0},
                             {"name": "real", "root": "/d/real", "weight": 1.0}]}}


def _with(parts: list[dict]) -> dict:
    return {**BASE, "data": {"mixture": parts}}


def test_a_changed_list_item_is_named_by_index_and_field() -> None:
    """Catches the refusal that prints both whole lists (the user must diff them by eye):
    one line per changed field, `data.mixture.1.weight: checkpoint 1.0, this run 2.0`."""
    parts = [dict(p) for p in BASE["data"]["mixture"]]
    parts[1]["weight"] = 2.0
    assert config_differences(BASE, _with(parts), 5) == [
        "data.mixture.1.weight: checkpoint 1.0, this run 2.0"]


def test_an_added_or_removed_item_is_named_by_index() -> None:
    """Catches an added part reported as two whole lists, or not at all."""
    more = [*BASE["data"]["mixture"], {"name": "extra", "root": "/d/x", "weight": 1.0}]
    (problem,) = config_differences(BASE, _with(more), 5)
    assert problem.startswith("data.mixture.2: only this run has it") and "'extra'" in problem
    (problem,) = config_differences(_with(more), BASE, 5)
    assert problem.startswith("data.mixture.2: only the checkpoint has it")
    assert "the checkpoint has 3 item(s), this run 2" in problem
