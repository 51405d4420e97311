"""The noise schedule: DDPM's forward process (training) and DDIM's deterministic reverse
step (acting), as diffusers' `DDPMScheduler.add_noise` and `DDIMScheduler.step` (eta 0,
epsilon prediction, "leading" timestep spacing, `set_alpha_to_one`) compute them with
lerobot's Diffusion Policy settings (the squared-cosine schedule, clipped samples).

Our own few lines rather than diffusers: the policy needs three formulas, diffusers brings
a large dependency (and its own torch version constraints) for them.

    alpha_bar(s) = cos((s + 0.008) / 1.008 * pi / 2)^2,   s = t / T
    beta_t = min(1 - alpha_bar((t + 1) / T) / alpha_bar(t / T), 0.999)
    abar_t = prod_{i <= t} (1 - beta_i)
    add_noise:  x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps
    DDIM step t -> p = t - T / steps (abar_p = 1 below 0):
        x0_hat = clip((x_t - sqrt(1 - abar_t) eps_hat) / sqrt(abar_t))
        x_p = sqrt(abar_p) x0_hat + sqrt(1 - abar_p) eps_hat
"""

from __future__ import annotations

import math

import torch


def squared_cosine_betas(timesteps: int, max_beta: float = 0.999) -> torch.Tensor:
    """beta_t of the squared-cosine schedule (Nichol & Dhariwal; diffusers'
    `squaredcos_cap_v2`), float64 `[timesteps]`."""

    def alpha_bar(s: float) -> float:
        return math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2

    return torch.tensor([min(1 - alpha_bar((t + 1) / timesteps) / alpha_bar(t / timesteps),
                             max_beta) for t in range(timesteps)], dtype=torch.float64)


class NoiseSchedule:
    """`T` noise levels; `add_noise` for training, `ddim_timesteps`/`ddim_step` to sample."""

    def __init__(self, timesteps: int, clip_sample: float | None = 1.0) -> None:
        self.timesteps, self.clip_sample = int(timesteps), clip_sample
        self.betas = squared_cosine_betas(self.timesteps)
        self.alphas_cumprod = torch.cumprod(1.0 - self.betas, 0)  # float64
        # Python floats for the sampler: constants of an exported graph, not tensor reads
        self._abar = self.alphas_cumprod.tolist()

    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor
                  ) -> torch.Tensor:
        """x_t for clean samples `x0 [B, ...]`, noise like it, levels `t [B]` (int)."""
        abar = self.alphas_cumprod.to(x0.device)[t].to(x0.dtype)
        abar = abar.reshape(-1, *([1] * (x0.dim() - 1)))
        return abar.sqrt() * x0 + (1 - abar).sqrt() * noise

    def ddim_timesteps(self, steps: int) -> list[int]:
        """The levels DDIM visits, from the noisiest: (steps-1)*r, ..., r, 0; r = T // steps."""
        if not 1 <= steps <= self.timesteps:
            raise ValueError(f"DDIM steps {steps} outside 1..{self.timesteps}")
        ratio = self.timesteps // steps
        return [i * ratio for i in reversed(range(steps))]

    def epsilon_of(self, x0: torch.Tensor, t: int, x: torch.Tensor) -> torch.Tensor:
        """The noise that level `t`'s `x` holds over the clean estimate `x0` (a U-Net that
        predicts the sample steps DDIM through it, as diffusers' `prediction_type="sample"`)."""
        abar_t = self._abar[t]
        return (x - math.sqrt(abar_t) * x0) / math.sqrt(1 - abar_t)

    def ddim_step(self, eps: torch.Tensor, t: int, x: torch.Tensor, steps: int
                  ) -> torch.Tensor:
        """x at the previous level of a `steps`-step DDIM from level `t`, given the
        predicted noise `eps` (deterministic: eta 0)."""
        prev = t - self.timesteps // steps
        abar_t = self._abar[t]
        abar_p = self._abar[prev] if prev >= 0 else 1.0
        x0 = (x - math.sqrt(1 - abar_t) * eps) / math.sqrt(abar_t)
        if self.clip_sample is not None:
            x0 = x0.clamp(-self.clip_sample, self.clip_sample)
        return math.sqrt(abar_p) * x0 + math.sqrt(1 - abar_p) * eps
