"""An ALOHA dataset without meta/aloha.json (copied without it, or recorded by another
tool) has unknown demonstration seeds, said with the file's path, never "no seeds".

Catches: the missing file read as an empty seed list (the evaluation seeds' check then
passes in silence), and a message that does not name the file."""

from __future__ import annotations

import json
from pathlib import Path

from embodichain_models.policies.act.data import demonstration_seeds

from embodichain.learning.sl import UnknownSeeds


def test_a_dataset_without_its_seed_file_has_unknown_seeds_naming_it(tmp_path: Path) -> None:
    unknown = demonstration_seeds(tmp_path)
    assert isinstance(unknown, UnknownSeeds)
    assert str(tmp_path / "meta" / "aloha.json") in unknown.why
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "aloha.json").write_text(json.dumps({"seeds": [3, 1]}))
    assert demonstration_seeds(tmp_path) == [3, 1]
