"""The NeRD transformer: causality, determinism and normalisation buffers."""

from __future__ import annotations

import math

import pytest
import torch
from embodichain_models.dynamics.nerd.model import (
    NerdModelConfig,
    NerdTransformer,
    apply_delta,
    state_delta,
)


def history(batch: int = 3, steps: int = 10, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, steps, 4, generator=gen), torch.randn(batch, steps, 2, generator=gen)


@pytest.mark.parametrize("later", [3, 9])
def test_causal_outputs_ignore_later_tokens(later: int) -> None:
    model = NerdTransformer(NerdModelConfig(causal=True)).eval()
    states, actions = history()
    changed_states, changed_actions = states.clone(), actions.clone()
    changed_states[:, later:] += 5.0
    changed_actions[:, later] -= 3.0
    with torch.no_grad():
        out, changed = model(states, actions), model(changed_states, changed_actions)
    torch.testing.assert_close(changed[:, :later], out[:, :later], rtol=0, atol=1e-6)
    assert not torch.allclose(changed[:, later:], out[:, later:])


def test_non_causal_outputs_see_later_tokens() -> None:
    model = NerdTransformer(NerdModelConfig(causal=False)).eval()
    states, actions = history()
    changed = states.clone()
    changed[:, -1] += 5.0
    with torch.no_grad():
        assert not torch.allclose(model(changed, actions)[:, 0], model(states, actions)[:, 0])


def test_same_seed_same_weights_regardless_of_global_rng() -> None:
    torch.manual_seed(1)
    a = NerdTransformer(NerdModelConfig(), seed=7)
    torch.manual_seed(2)
    b = NerdTransformer(NerdModelConfig(), seed=7)
    c = NerdTransformer(NerdModelConfig(), seed=8)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.embed.weight, c.embed.weight)


def test_shapes_defaults_and_no_bias() -> None:
    cfg = NerdModelConfig()
    assert (cfg.layers, cfg.d_model, cfg.heads, cfg.window) == (2, 64, 4, 10)
    model = NerdTransformer(cfg)
    states, actions = history(steps=4)
    assert model(states, actions).shape == (3, 4, 4)  # shorter histories are fine
    assert not [n for n, _ in model.named_parameters() if n.endswith("bias")]
    with pytest.raises(ValueError, match="window"):
        model(*history(steps=11))


def test_normalization_is_in_buffers_and_state_dict() -> None:
    model = NerdTransformer(NerdModelConfig())
    model.set_normalization(torch.arange(6.0), torch.full((6,), 4.0),
                            torch.ones(4), torch.full((4,), 9.0))
    state = model.state_dict()
    for name in ("input_mean", "input_var", "target_mean", "target_var"):
        assert name in state and name in dict(model.named_buffers())
    delta = torch.tensor([[1.0, 4.0, -2.0, 0.0]])
    normed = model.normalize_target(delta)
    torch.testing.assert_close(normed, (delta - 1) / math.sqrt(9 + 1e-5))
    torch.testing.assert_close(model.denormalize_target(normed), delta)


def test_theta_difference_is_wrapped() -> None:
    states = torch.tensor([[3.1, 3.1, 0.0, 0.0], [3.2, -3.1, 0.0, 0.0]])
    delta = state_delta(states)
    torch.testing.assert_close(delta[0, 1], torch.tensor(2 * math.pi - 6.2))
    nxt = apply_delta(states[0], delta[0])
    torch.testing.assert_close(nxt, states[1])
