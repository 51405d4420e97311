"""The snapshot comparison of `reproduce` (R-TRUST-5): every tensor and every other value of
the training state, by path, the run's identity left out. In-process, on copies of the
shared one-process run whose snapshots are rewritten (valid digests) with one value
changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from embodichain.core.checkpoint.file import make_checkpoint, read_checkpoint, write_checkpoint
from embodichain.core.runs.snapshot_compare import compare_snapshots


def _identity_keys(run: Path) -> set[str]:
    return set(json.loads((run / "run.json").read_text()))


def _rewrite(path: Path, change) -> None:  # noqa: ANN001 - a function of the payload
    payload = read_checkpoint(path)["payload"]
    change(payload)
    write_checkpoint(make_checkpoint(payload), path)


def test_the_same_snapshots_compare_equal_whatever_their_identity(
        sl_ddp_one_process: Path, copy_run) -> None:
    """Catches a comparison of the run's identity (its id, times, directory) as if it were
    state, and one that compares no tensor at all."""
    run = copy_run(sl_ddp_one_process)
    _rewrite(run / "step_100.pt", lambda p: p["run"].update(run_id="another",
                                                             created_at="another time"))
    compared = compare_snapshots(sl_ddp_one_process, run, 200, _identity_keys(run))
    assert compared.difference is None
    assert compared.names == ("step_100.pt", "step_200.pt") and compared.tensors > 20


@pytest.mark.parametrize(("change", "named"), [
    (lambda p: p["learner"]["optimizer"]["state"][0]["exp_avg"].view(-1)[3].add_(1e-7),
     "tensor learner.optimizer.state.0.exp_avg"),
    (lambda p: p["ranks"][0]["rng"]["python"][1].__setitem__(5, 0),
     "list ranks.0.rng.python[1]"),
    (lambda p: p["ranks"][0]["sampler"].update(batches_drawn=1),
     "int ranks.0.sampler.batches_drawn"),
])
def test_a_changed_value_of_the_state_is_named(sl_ddp_one_process: Path, copy_run, change,
                                               named: str) -> None:
    """Catches a comparison of the model alone: an optimizer moment off by one ulp-scale
    step, a Python RNG word, the sampler's position are each named, at their update."""
    run = copy_run(sl_ddp_one_process)
    _rewrite(run / "step_100.pt", change)
    compared = compare_snapshots(sl_ddp_one_process, run, 200, _identity_keys(run))
    assert compared.difference is not None
    assert (compared.difference.update, compared.difference.what) == (100, named)
    assert compared.names == ("step_100.pt",)


def test_a_tensor_of_another_dtype_is_named_by_kind(sl_ddp_one_process: Path,
                                                   copy_run) -> None:
    """Catches a digest of the values alone: the same numbers in float64 differ."""
    run = copy_run(sl_ddp_one_process)

    def widen(payload) -> None:  # noqa: ANN001
        model = payload["learner"]["model"]
        model["0.bias"] = model["0.bias"].to(torch.float64)

    _rewrite(run / "step_200.pt", widen)
    difference = compare_snapshots(sl_ddp_one_process, run, 200,
                                   _identity_keys(run)).difference
    assert difference is not None and difference.update == 200
    assert "float32 (32,) in the original, tensor float64 (32,)" in difference.detail
