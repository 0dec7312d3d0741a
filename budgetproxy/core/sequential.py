"""Always-valid inference for a difference of bounded means: a confidence sequence and a decision.

The confidence sequence is the predictable plug-in empirical-Bernstein one of Waudby-Smith and
Ramdas (2024, JRSS B 86(1), Theorem 2) for the mean of observations in [0, 1]; it holds at
every sample size at once (Ville's inequality), so it may be read after every episode. Its
running intersection holds too, which makes decisions final.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Decision = Literal["continue", "stop_a_better", "stop_b_better", "stop_futile"]

# The largest bet (Waudby-Smith and Ramdas suggest 1/2 or 3/4): a smaller one loses little
# power and keeps a run of identical observations from shrinking the interval too fast.
LAMBDA_MAX = 0.5


@dataclass(frozen=True)
class Interval:
    estimate: float | None  # the plain mean (None before any observation)
    low: float
    high: float
    n: int


class MeanSequence:
    """A running confidence sequence for the mean of observations in [0, 1] (PrPl-EB).

    Feed observations one at a time with `add`; `interval` is valid at every n at once.
    """

    __slots__ = ("alpha", "n", "total", "_mu", "_var_sum", "_lam_sum", "_lam_x", "_pen",
                 "low", "high", "_log2a")

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self._log2a = math.log(2 / alpha)
        self.n = 0
        self.total = 0.0
        self._mu = 0.5  # the predictable mean estimate: (1/2 + sum) / (n + 1)
        self._var_sum = 0.25  # 1/4 + sum of (x_i - mu_i)^2
        self._lam_sum = 0.0
        self._lam_x = 0.0
        self._pen = 0.0  # sum of v_i * psi_E(lambda_i)
        self.low, self.high = 0.0, 1.0

    def add(self, x: float) -> None:
        t = self.n + 1
        var_prev = self._var_sum / t  # sigma^2_{t-1}
        lam = min(math.sqrt(2 * self._log2a / (var_prev * t * math.log(1 + t))), LAMBDA_MAX)
        v = 4 * (x - self._mu) ** 2  # against the previous mean estimate
        self._pen += v * (-math.log1p(-lam) - lam) / 4
        self._lam_sum += lam
        self._lam_x += lam * x
        self.n = t
        self.total += x
        self._mu = (0.5 + self.total) / (t + 1)
        self._var_sum += (x - self._mu) ** 2
        centre = self._lam_x / self._lam_sum
        radius = (self._log2a + self._pen) / self._lam_sum
        self.low = max(self.low, centre - radius)  # the running intersection
        self.high = min(self.high, centre + radius)
        if self.low > self.high:  # empty only on the alpha-probability event: keep a point
            self.low = self.high = (self.low + self.high) / 2

    def interval(self) -> Interval:
        est = self.total / self.n if self.n else None
        return Interval(est, self.low, self.high, self.n)


class DifferenceSequence:
    """A confidence sequence for mean(a) - mean(b) from pairs of outcomes in [0, 1].

    Each pair's difference d in [-1, 1] is fed as (d + 1) / 2; the interval maps back.
    """

    __slots__ = ("_mean",)

    def __init__(self, alpha: float) -> None:
        self._mean = MeanSequence(alpha)

    def add(self, a: float, b: float) -> None:
        self._mean.add((a - b + 1) / 2)

    def interval(self) -> Interval:
        m = self._mean.interval()
        est = None if m.estimate is None else 2 * m.estimate - 1
        return Interval(est, 2 * m.low - 1, 2 * m.high - 1, m.n)


def decide(low: float, high: float, min_effect: float | None) -> Decision:
    """Stop when the interval excludes 0 (the sign says which arm is better), or, with a
    minimum effect, when it excludes every difference at least that large either way."""
    if low > 0:
        return "stop_a_better"
    if high < 0:
        return "stop_b_better"
    if min_effect is not None and -min_effect < low and high < min_effect:
        return "stop_futile"
    return "continue"


class Pairer:
    """Forms pairs (outcome of arm a, outcome of arm b) as outcomes arrive in finishing order.

    With `by_task`, an outcome pairs with the oldest unpaired one of the other arm on the same
    task (episodes without a task pair among themselves); otherwise with the oldest of the
    other arm on any task (a unit of whole tasks cannot pair within one).
    """

    __slots__ = ("a", "b", "by_task", "_waiting")

    def __init__(self, a: int, b: int, *, by_task: bool) -> None:
        self.a, self.b, self.by_task = a, b, by_task
        self._waiting: dict[tuple[str | None, int], deque[float]] = {}

    def add(self, task: str | None, arm: int, y: float) -> tuple[float, float] | None:
        """The pair this outcome completes, if any."""
        if arm != self.a and arm != self.b:
            return None
        key = task if self.by_task else None
        other = self._waiting.get((key, self.b if arm == self.a else self.a))
        if other:
            z = other.popleft()
            return (y, z) if arm == self.a else (z, y)
        self._waiting.setdefault((key, arm), deque()).append(y)
        return None


def paired(
    outcomes: Iterable[tuple[str | None, int, float]], a: int, b: int, *, by_task: bool,
) -> Iterable[tuple[float, float]]:
    """The pairs of arms a and b from (task id, arm index, outcome) in finishing order, in the
    order the second of each arrives (Pairer)."""
    pairer = Pairer(a, b, by_task=by_task)
    for task, arm, y in outcomes:
        pair = pairer.add(task, arm, y)
        if pair is not None:
            yield pair
