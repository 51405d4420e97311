"""How far a success rate measured on n episodes can be trusted (R-TRUST-3).

A rate k/n carries its Wilson score interval at 95% (Wilson 1927; the interval that stays
inside [0, 1] and keeps its coverage near 0 and n, where the normal approximation's
collapses to a point). A claim "above X" holds only where the lower bound is above X.
Pure arithmetic (no numpy, no torch): eval's summary, `report` and the benchmarks use it.
"""

from __future__ import annotations

import math

Z_95 = 1.959963984540054
"""The standard normal's 97.5% quantile: a two-sided 95% interval."""


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval (low, high) of `successes` out of `n` trials; (0, 1) for
    n = 0 (nothing measured). ValueError for counts that are not 0 <= successes <= n."""
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"a success count is 0..n: got {successes} of {n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # At k = 0 and k = n the bound is exactly 0 (1): no rounding just off the edge.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def successes_of(rate: float, n: int) -> int:
    """The count behind a rate measured on n episodes (rates are k/n exactly)."""
    return int(round(rate * n))


def rate_with_interval(successes: int, n: int) -> str:
    """`92% (46/50, 95% CI 81-97%)`: a rate as every table in the project writes it."""
    low, high = wilson_interval(successes, n)
    rate = successes / n if n else 0.0
    return (f"{100 * rate:.0f}% ({successes}/{n}, 95% CI {100 * low:.0f}-"
            f"{100 * high:.0f}%)")
