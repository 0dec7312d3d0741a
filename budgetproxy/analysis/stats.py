"""Statistics the analysis needs beyond the estimator: bootstrap CIs and p-values, multiple
comparison adjustments and a chi-square test."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

__all__ = [
    "ADJUSTMENTS", "FEW_TASKS", "FEW_TASKS_NOTE", "adjust_p", "bootstrap_ci", "bootstrap_p",
    "chi_square", "chi_square_sf", "expanded_tail", "few_tasks", "ratio_ci", "t_quantile",
    "zero_width_note",
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
    and 20 tasks a paired difference's 95% interval covered 73-84% in tests/analysis/
    test_coverage.py)."""
    return n_tasks < FEW_TASKS or n_episodes < 2 * k * n_tasks


def t_quantile(p: float, dof: int) -> float:
    """The p-quantile (p >= 0.5) of Student's t with `dof` degrees of freedom."""
    if not 0.5 <= p < 1 or dof < 1:
        raise ValueError(f"need 0.5 <= p < 1 and dof >= 1, got p={p}, dof={dof}")
    return _t_quantile(p, dof)


@functools.lru_cache(maxsize=1024)
def _t_quantile(p: float, dof: int) -> float:
    z = NormalDist().inv_cdf(p)
    if dof > 200:
        # Cornish-Fisher terms to 1/dof^3: within 1e-8 of the exact quantile at this dof
        z3, z5, z7 = z**3, z**5, z**7
        return (z + (z3 + z) / (4 * dof) + (5 * z5 + 16 * z3 + 3 * z) / (96 * dof**2)
                + (3 * z7 + 19 * z5 + 17 * z3 - 15 * z) / (384 * dof**3))
    low, high = 0.0, 1e7
    for _ in range(200):  # bisection on the exact CDF: P(|T| <= t) = 2p - 1
        mid = (low + high) / 2
        if _t_central(mid, dof) < 2 * p - 1:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2


def _t_central(t: float, dof: int) -> float:
    """P(|T| <= t) for integer `dof`: the finite sums of Abramowitz and Stegun 26.7.3-4."""
    theta = math.atan(t / math.sqrt(dof))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if dof % 2 == 1:
        term = math.cos(theta)
        total = 0.0 if dof == 1 else term
        for j in range(3, dof - 1, 2):
            term *= c2 * (j - 1) / j
            total += term
        return 2 / math.pi * (theta + s * total)
    term = total = 1.0
    for j in range(2, dof - 1, 2):
        term *= c2 * (j - 1) / j
        total += term
    return s * total


def expanded_tail(m: int, confidence: float = 0.95) -> float:
    """The tail probability at which to read the bootstrap means of m values.

    The percentile interval of a mean is as narrow as a normal interval with the variance
    divided by m, not m − 1, and a z in place of t: at 20 tasks it covers about 93%, less for
    the skewed per-task estimates of Pass@K at K > 1. Reading the resamples at Φ(−√(m/(m−1))
    · t) instead of (1 − confidence)/2 widens it to a t interval's width while it keeps the
    resamples' shape (Hesterberg's expanded percentile interval); tests/analysis/
    test_coverage.py measures what it covers."""
    t = t_quantile(1 - (1 - confidence) / 2, m - 1)
    return NormalDist().cdf(-math.sqrt(m / (m - 1)) * t)


def bootstrap_ci(
    values: Sequence[float], resamples: int = 1000, seed: int = 0, confidence: float = 0.95
) -> tuple[float, float]:
    """Expanded percentile bootstrap CI of the mean of `values` (one value per task,
    resampled; `expanded_tail` says why and how).

    The draws pick positions, so the same values in the same order and the same seed give the
    same interval: callers pass tasks in a fixed order (sorted by task_id)."""
    import numpy as np

    means = _resampled_means(values, resamples, seed)
    if means is None:
        return float(values[0]), float(values[0])
    alpha = expanded_tail(len(values), confidence)
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return float(low), float(high)


def bootstrap_p(values: Sequence[float], resamples: int = 1000, seed: int = 0) -> float:
    """Two-sided bootstrap p-value of "the mean is 0", from the same draws as `bootstrap_ci`
    with the same seed: twice the smaller share of resampled means on either side of 0 (at
    most 1). It is below 0.05 exactly when the plain 95% percentile interval of those draws
    excludes 0 (up to the quantiles' interpolation; `bootstrap_ci` reads them wider); its
    resolution is 1/resamples. Values that are all equal (nothing to resample) give 1: no
    evidence either way."""
    import numpy as np

    means = _resampled_means(values, resamples, seed)
    if means is None:
        return 1.0
    below = float(np.count_nonzero(means <= 0)) / len(means)
    above = float(np.count_nonzero(means >= 0)) / len(means)
    return min(1.0, 2 * min(below, above))


def _resampled_means(values: Sequence[float], resamples: int, seed: int) -> Any:
    """The means of `resamples` resamples of `values` (positions drawn with `seed`), or None
    when every resample has the same mean (one value, or all equal)."""
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
    rows = max(1, _MAX_CELLS // m)
    for start in range(0, resamples, rows):
        stop = min(resamples, start + rows)
        idx = rng.integers(0, m, size=(stop - start, m))
        means[start:stop] = data[idx].mean(axis=1)
    return means


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
