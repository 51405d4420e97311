"""How an environment's frame becomes the film's uint8 RGB (`rgb_frame`)."""

from __future__ import annotations

import numpy as np

from embodichain.core.evaluation.video import rgb_frame


def test_a_float_frame_reaching_exactly_one_is_read_as_zero_to_one() -> None:
    """Catches [0, 1] told from [0, 255] by `max < 1`: a float frame whose brightest pixel
    is exactly 1.0 (white, as most renderers clip) would be taken as 0..255 and filmed
    nearly black. 0, 0.5 and 1.0 are 0, 128 and 255."""
    frame = np.array([[[0.0, 0.5, 1.0]]], np.float32).repeat(2, axis=0)
    assert rgb_frame(frame).tolist() == [[[0, 128, 255]]] * 2
    assert (rgb_frame(np.ones((3, 4, 3), np.float64)) == 255).all()
