"""Wilson 95% intervals of success rates (R-TRUST-3): the arithmetic, against published
values, and where eval's records carry them."""

from __future__ import annotations

import math

import pytest

from embodichain.core.evaluation.intervals import (
    Z_95,
    rate_with_interval,
    successes_of,
    wilson_interval,
)
from embodichain.core.evaluation.records import EvaluationResult, summary


@pytest.mark.parametrize(("k", "n", "low", "high"), [
    (46, 50, 0.8116175, 0.9684505),   # scipy.stats.binomtest(46, 50).proportion_ci("wilson")
    (38, 40, 0.8349612, 0.9861793),
    (10, 40, 0.1418712, 0.4019396),
    (5, 10, 0.2365931, 0.7634069),
])
def test_known_values(k: int, n: int, low: float, high: float) -> None:
    """Catches the normal (Wald) interval in its place (46/50: 0.845-0.995) and a z of 2
    or 1.645."""
    got = wilson_interval(k, n)
    assert got == pytest.approx((low, high), abs=1e-6)


def test_edges() -> None:
    """0/n and n/n: the bound at the edge is exactly 0 (1) and the other is z²/(n + z²)
    from it; nothing measured is (0, 1); impossible counts are refused. Catches an interval
    collapsing to the point 0 or 1 (the normal approximation's) and a bound just outside
    [0, 1] by rounding."""
    z2 = Z_95 ** 2
    for n in (1, 7, 50):
        assert wilson_interval(0, n) == (0.0, pytest.approx(z2 / (n + z2)))
        assert wilson_interval(n, n) == (pytest.approx(n / (n + z2)), 1.0)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    for k, n in ((-1, 5), (6, 5), (0, -1)):
        with pytest.raises(ValueError):
            wilson_interval(k, n)
    assert rate_with_interval(46, 50) == "92% (46/50, 95% CI 81-97%)"
    assert successes_of(0.92, 50) == 46 and successes_of(1 / 3, 3) == 1


def test_eval_summary_carries_an_interval_per_rate() -> None:
    """Catches a summary without intervals, an interval of a mean return, and one computed
    over another count of episodes than the records'."""
    records = [{"episode": e, "seed": 200 + e, "success": e < 3, "return": 1.0, "length": 5,
                "failure": None, "outcomes": {"strict_success": e < 1}} for e in range(4)]
    got = summary(EvaluationResult(records, seed_role="test"), {"step": 1})
    assert set(got["intervals"]) == {"validation/success_rate",
                                     "validation/strict_success_rate"}
    low, high = wilson_interval(3, 4)
    assert got["intervals"]["validation/success_rate"] == [round(low, 4), round(high, 4)]
    assert got["seeds"] == "200..203" and got["seed_role"] == "test"
    assert not math.isclose(*got["intervals"]["validation/strict_success_rate"])
