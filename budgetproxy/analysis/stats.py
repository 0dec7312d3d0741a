"""Statistics the analysis needs beyond the estimator: bootstrap CIs and p-values, multiple
comparison adjustments and a chi-square test."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = [
    "ADJUSTMENTS", "FEW_TASKS", "FEW_TASKS_NOTE", "PILED_NOTE", "PILED_SHARE", "adjust_p",
    "bootstrap_ci", "bootstrap_p", "chi_square", "chi_square_sf", "few_tasks", "piled",
    "ratio_ci", "zero_width_note",
]

# Resample matrices are built in slices of at most this many cells to bound memory.
_MAX_CELLS = 4_000_000

# Below this many tasks a bootstrap interval over tasks rests on too few draws to trust.
FEW_TASKS = 10
FEW_TASKS_NOTE = f"fewer than {FEW_TASKS} tasks, or under 2K eligible episodes a task on average"


def few_tasks(n_tasks: int, n_episodes: int, k: int) -> bool:
    """Whether a cell's interval rests on too few draws: fewer than FEW_TASKS tasks, or fewer
    than 2K eligible episodes per task on average. As K nears a task's n, its estimate takes
    few values (at K = n only 0 or 1) and piles up at the bounds, where an interval from the
    spread of the tasks misses the truth far more often than its level says (at K = n = 8
    and 20 tasks a paired difference's 95% interval covered 75-82% in tests/analysis/
    test_coverage.py)."""
    return n_tasks < FEW_TASKS or n_episodes < 2 * k * n_tasks


# A cell with at least this share of its tasks' estimates at exactly 1 (or at exactly 0).
PILED_SHARE = 0.75
PILED_NOTE = ("at least 3/4 of the tasks' estimates at exactly 1 (or at exactly 0): the "
              "interval, from the spread of the tasks alone, understates the uncertainty")


def piled(values: Sequence[float]) -> bool:
    """Whether at least PILED_SHARE of the per-task estimates sit at exactly 1, or at least
    that share at exactly 0. A task whose episodes all succeeded (or all failed) looks certain
    to the bootstrap over tasks, which sees no spread within a task: with most tasks there the
    interval is too narrow and misses on the side of the pile (easy tasks, success chances
    Beta(8, 0.5), 20 tasks, K = 2: 10 episodes a task covered 83%, 5 covered 70%; this flags
    94% and 100% of those cells). Over simulated logs (600 a population, 10-40 tasks, 4-20
    episodes a task, K = 1, 2, 4 with n >= 2K) it flagged at most 2% of the cells of uniform
    task difficulty and 2.5% of U-shaped; the cells it left unflagged covered 95.5% pooled,
    yet 91-92% in some rows of easy tasks at 10-20 tasks and 20 episodes a task, and 73% of
    the 40 cells in 600 left unflagged at 10 easy tasks and K = 4.
    """
    if not values:
        return False
    at_one = sum(1 for v in values if v == 1.0)
    at_zero = sum(1 for v in values if v == 0.0)
    return max(at_one, at_zero) >= PILED_SHARE * len(values)


def bootstrap_ci(
    values: Sequence[float], resamples: int = 1000, seed: int = 0, confidence: float = 0.95
) -> tuple[float, float]:
    """Symmetric bootstrap-t CI of the mean of `values` (one value per task, resampled), kept
    within the values' range.

    With m values of mean x̄ and variance s², each resample b gives |x̄*_b − x̄| / se*_b; the
    interval is x̄ ± q·se, q the `confidence` quantile of those ratios (Hall 1988, "On
    symmetric bootstrap confidence intervals"). se² is (s² + s²/m)/m, and each se*_b² the same
    from the resample's own variance s*_b² + s²/m: the s²/m added is what a smoothed bootstrap
    with that kernel variance would add, and it keeps a resample of one repeated value from
    giving an infinite ratio. Studentizing each resample follows how the spread of the
    per-task estimates moves with their mean (at K > 1 a sample short of the rare tasks that
    move the mean is short of spread too), where a percentile interval held at 91%;
    tests/analysis/test_coverage.py measures what it covers.

    The draws pick positions, so the same values in the same order and the same seed give the
    same interval: callers pass tasks in a fixed order (sorted by task_id)."""
    import numpy as np

    drawn = _resampled_moments(values, resamples, seed)
    if drawn is None:
        return float(values[0]), float(values[0])
    means, variances = drawn
    data = np.asarray(values, dtype=np.float64)
    m = len(data)
    mean = float(data.mean())
    smoothing = float(data.var(ddof=1)) / m
    ratios = np.abs(means - mean) / np.sqrt((variances + smoothing) / m)
    half = float(np.quantile(ratios, confidence)) * math.sqrt((m + 1) * smoothing / m)
    return max(mean - half, float(data.min())), min(mean + half, float(data.max()))


def bootstrap_p(values: Sequence[float], resamples: int = 1000, seed: int = 0) -> float:
    """Two-sided bootstrap p-value of "the mean is 0", from the same draws as `bootstrap_ci`
    with the same seed: twice the smaller share of resampled means on either side of 0 (at
    most 1), the percentile reading of those draws; its resolution is 1/resamples. Values
    that are all equal (nothing to resample) give 1: no evidence either way."""
    import numpy as np

    drawn = _resampled_moments(values, resamples, seed)
    if drawn is None:
        return 1.0
    means = drawn[0]
    below = float(np.count_nonzero(means <= 0)) / len(means)
    above = float(np.count_nonzero(means >= 0)) / len(means)
    return min(1.0, 2 * min(below, above))


def _resampled_moments(values: Sequence[float], resamples: int, seed: int) -> Any:
    """The means and variances (ddof 1) of `resamples` resamples of `values` (positions drawn
    with `seed`), or None when every resample has the same mean (one value, or all equal)."""
    import numpy as np

    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    data = np.asarray(values, dtype=np.float64)
    m = len(data)
    if m == 0:
        raise ValueError("no values to resample")
    if m == 1 or float(data.min()) == float(data.max()):
        return None
    rng = np.random.default_rng(seed)
    means = np.empty(resamples, dtype=np.float64)
    variances = np.empty(resamples, dtype=np.float64)
    rows = max(1, _MAX_CELLS // m)
    for start in range(0, resamples, rows):
        stop = min(resamples, start + rows)
        drawn = data[rng.integers(0, m, size=(stop - start, m))]
        means[start:stop] = drawn.mean(axis=1)
        variances[start:stop] = drawn.var(axis=1, ddof=1)
    return means, variances


# --adjust: how the p-values of a family of cells are adjusted for being read together.
ADJUSTMENTS = {
    "holm": "Holm (family-wise error rate)",
    "bh": "Benjamini-Hochberg (false discovery rate)",
    "none": "none (each cell on its own)",
}


def adjust_p(p_values: Sequence[float], method: str) -> list[float]:
    """The p-values adjusted over the family they form, in their order: Holm's step-down
    (controls the chance of any false claim among them) or Benjamini-Hochberg's step-up
    (controls the expected share of false claims among those made); "none" returns them."""
    m = len(p_values)
    if method == "none" or m == 0:
        return list(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    out = [0.0] * m
    if method == "holm":
        running = 0.0
        for rank, i in enumerate(order):
            running = max(running, min(1.0, (m - rank) * p_values[i]))
            out[i] = running
        return out
    if method == "bh":
        running = 1.0
        for rank in range(m - 1, -1, -1):
            i = order[rank]
            running = min(running, m * p_values[i] / (rank + 1))
            out[i] = min(1.0, running)
        return out
    raise ValueError(f"unknown adjustment {method!r}; expected one of {', '.join(ADJUSTMENTS)}")


def ratio_ci(
    numerators: Sequence[int], denominators: Sequence[int], resamples: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap CI of Σ numerators / Σ denominators, resampling clusters (tasks):
    episodes of one task are not independent draws, so they are resampled together."""
    import numpy as np

    num = np.asarray(numerators, dtype=np.float64)
    den = np.asarray(denominators, dtype=np.float64)
    m = len(num)
    if m == 0 or float(den.sum()) == 0:
        raise ValueError("no episodes to resample")
    if m == 1:
        value = float(num[0] / den[0])
        return value, value
    rng = np.random.default_rng(seed)
    shares = np.empty(resamples, dtype=np.float64)
    rows = max(1, _MAX_CELLS // m)
    for start in range(0, resamples, rows):
        stop = min(resamples, start + rows)
        idx = rng.integers(0, m, size=(stop - start, m))
        totals = den[idx].sum(axis=1)
        shares[start:stop] = np.divide(num[idx].sum(axis=1), totals, where=totals > 0,
                                       out=np.zeros(stop - start))  # fmt: skip
    low, high = np.quantile(shares, [0.025, 0.975])
    return float(low), float(high)


def zero_width_note(
    values: Sequence[float], low: float, high: float, difference: bool = False
) -> str | None:
    """Why an interval has zero width, in words for a reader; None when it has width.
    `difference`: the values are paired differences, not per-task estimates.

    A zero-width interval is not certainty: with one task there is nothing to resample, and
    when every task has the same value every resample has it too."""
    if low < high:
        return None
    if len(values) == 1:
        return "zero width: one task"
    if difference:
        return "zero width: no task differs" if values[0] == 0 else "zero width: all tasks equal"
    if all(v == 1.0 for v in values):
        return "zero width: all tasks at 1"
    if all(v == 0.0 for v in values):
        return "zero width: all tasks at 0"
    return "zero width: all tasks equal"


def chi_square(observed: Sequence[float], expected: Sequence[float]) -> float:
    """Pearson's statistic Σ (o − e)² / e."""
    return sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))


def chi_square_sf(x: float, dof: int) -> float:
    """P(X ≥ x) for X ~ χ²(dof): the regularized upper incomplete gamma Q(dof/2, x/2)."""
    if dof < 1:
        raise ValueError(f"dof must be at least 1, got {dof}")
    if x <= 0:
        return 1.0
    return _gamma_q(dof / 2, x / 2)


def _gamma_q(a: float, x: float) -> float:
    # Series for P when x < a + 1, Lentz's continued fraction for Q otherwise
    # (Numerical Recipes §6.2); both converge fast in their regions.
    log_prefix = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        denom = a
        for _ in range(10_000):
            denom += 1
            term *= x / denom
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_prefix))
    tiny = 1e-300
    b = x + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return min(1.0, math.exp(log_prefix) * h)
