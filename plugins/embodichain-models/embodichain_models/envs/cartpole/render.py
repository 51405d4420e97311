"""Draw cart-pole states as RGB frames: a track, a cart and its pole, anti-aliased.

The view spans x in [-5, 5] m and y in [-2, 2] m (θ = 0: the pole points up). Drawing is
vectorised over a batch of states, so rendering thousands of frames takes seconds.
"""

from __future__ import annotations

import torch

X_RANGE, Y_RANGE = 5.0, 2.0
POLE_LENGTH = 1.5  # drawn length (m): longer than the physical 1 m, so the angle is clear
CART_HALF = (0.45, 0.22)  # half width, half height (m)
BACKGROUND = (235, 235, 235)
TRACK, CART, POLE = (150, 150, 150), (40, 90, 200), (200, 50, 40)


def render(states: torch.Tensor, size: int = 64) -> torch.Tensor:
    """uint8 frames `[N, 3, size, size]` of states `[N, 4]` (`[x, θ, ẋ, θ̇]`)."""
    states = states.to(torch.float32)
    n = states.shape[0]
    px_x, px_y = size / (2 * X_RANGE), size / (2 * Y_RANGE)  # pixels per metre
    coords = torch.arange(size, dtype=torch.float32) + 0.5
    u = coords.view(1, 1, size)  # column
    v = coords.view(1, size, 1)  # row (top to bottom)
    cu = ((states[:, 0] + X_RANGE) * px_x).view(n, 1, 1)
    cv = torch.full_like(cu, Y_RANGE * px_y)  # the hinge sits on the track (y = 0)
    # Cart: a box with one-pixel soft edges.
    du = (u - cu).abs() - CART_HALF[0] * px_x
    dv = (v - cv).abs() - CART_HALF[1] * px_y
    cart = (0.5 - torch.maximum(du, dv)).clamp(0, 1)
    # Pole: a thick segment from the hinge to its tip, soft edges.
    tip_u = cu + POLE_LENGTH * torch.sin(states[:, 1]).view(n, 1, 1) * px_x
    tip_v = cv - POLE_LENGTH * torch.cos(states[:, 1]).view(n, 1, 1) * px_y
    su, sv = tip_u - cu, tip_v - cv
    t = (((u - cu) * su + (v - cv) * sv) / (su * su + sv * sv).clamp_min(1e-6)).clamp(0, 1)
    dist = torch.hypot(u - (cu + t * su), v - (cv + t * sv))
    pole = (1.6 - dist).clamp(0, 1)
    track = ((0.8 - (v - cv).abs()).clamp(0, 1)).expand(n, size, size)
    image = torch.tensor(BACKGROUND, dtype=torch.float32).view(1, 3, 1, 1).expand(n, 3, size, size)
    for mask, colour in ((track, TRACK), (cart, CART), (pole, POLE)):
        c = torch.tensor(colour, dtype=torch.float32).view(1, 3, 1, 1)
        image = image + mask.unsqueeze(1) * (c - image)
    return image.round().clamp(0, 255).to(torch.uint8)
