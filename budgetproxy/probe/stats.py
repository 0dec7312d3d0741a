"""Probe statistics: win and tie rates of A over B per state, with bootstrap CIs over tasks."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from budgetproxy.analysis.stats import FEW_TASKS

TIE = 1e-9  # mean values this close are a tie
DEPTHS = (("early", 0.0, 1 / 3), ("middle", 1 / 3, 2 / 3), ("late", 2 / 3, 1.01))


@dataclass(frozen=True)
class Compared:
    """One state's result: each policy's mean action value there."""

    task_id: str
    fraction: float
    a_mean: float
    b_mean: float
    a_corrected: float | None = None  # share of A's actions that fixed or left the failed call
    b_corrected: float | None = None

    @property
    def diff(self) -> float:
        return self.a_mean - self.b_mean

    @property
    def win(self) -> float:
        return 1.0 if self.diff > TIE else 0.0

    @property
    def tie(self) -> float:
        return 1.0 if abs(self.diff) <= TIE else 0.0

    @property
    def net(self) -> float:
        """+1 when A wins the state, −1 when B does, 0 on a tie."""
        return 1.0 if self.diff > TIE else -1.0 if self.diff < -TIE else 0.0


def depth_of(fraction: float) -> str:
    return next(name for name, lo, hi in DEPTHS if lo <= fraction < hi)


def bootstrap(
    groups: Mapping[str, Sequence[Any]], stat: Callable[[Sequence[Any]], float],
    resamples: int, seed: int, confidence: float = 0.95,
) -> tuple[float, float]:
    """Percentile CI of `stat` over the pooled rows of tasks resampled with replacement."""
    tasks = sorted(groups)
    rng = random.Random(seed)
    values = []
    for _ in range(resamples):
        rows: list[Any] = []
        for t in rng.choices(tasks, k=len(tasks)):
            rows.extend(groups[t])
        values.append(stat(rows))
    values.sort()
    alpha = (1 - confidence) / 2
    lo = values[min(len(values) - 1, int(alpha * len(values)))]
    hi = values[min(len(values) - 1, int((1 - alpha) * len(values)))]
    return lo, hi


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _by_task(rows: Sequence[Compared]) -> dict[str, list[Compared]]:
    groups: dict[str, list[Compared]] = defaultdict(list)
    for r in rows:
        groups[r.task_id].append(r)
    return dict(groups)


def _rates(rows: Sequence[Compared], resamples: int, seed: int) -> dict[str, Any]:
    """Win and tie rates with the win rate's CI; the net win (wins − losses, ties apart:
    which policy wins more states) and the mean value difference A − B (by how much), each
    with its own CI."""
    if not rows:
        return {"win_rate": None, "tie_rate": None, "ci_low": None, "ci_high": None,
                "n_states": 0, "n_tasks": 0, "mean_diff": None, "diff_ci_low": None,
                "diff_ci_high": None, "net_win": None, "net_ci_low": None, "net_ci_high": None,
                "few_tasks": False}
    groups = _by_task(rows)
    lo = hi = net_lo = net_hi = diff_lo = diff_hi = None
    if resamples:
        lo, hi = bootstrap(groups, lambda rs: _mean([r.win for r in rs]), resamples, seed)
        net_lo, net_hi = bootstrap(groups, lambda rs: _mean([r.net for r in rs]), resamples,
                                   seed)
        diff_lo, diff_hi = bootstrap(groups, lambda rs: _mean([r.diff for r in rs]),
                                     resamples, seed)
    return {"win_rate": _mean([r.win for r in rows]), "tie_rate": _mean([r.tie for r in rows]),
            "ci_low": lo, "ci_high": hi, "n_states": len(rows), "n_tasks": len(groups),
            "mean_diff": _mean([r.diff for r in rows]), "diff_ci_low": diff_lo,
            "diff_ci_high": diff_hi, "net_win": _mean([r.net for r in rows]),
            "net_ci_low": net_lo, "net_ci_high": net_hi,
            # as analyze's cells: an interval over fewer tasks rests on too few draws to name
            # a winner by (over 2 tasks a bootstrap has 3 distinct resamples)
            "few_tasks": len(groups) < FEW_TASKS}


def summarize(rows: Sequence[Compared], resamples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """The view's numbers (docs/probe.md), split by depth into the trajectory."""
    out = _rates(rows, resamples, seed)
    out["by_depth"] = [
        {"depth": name, **_rates([r for r in rows if depth_of(r.fraction) == name],
                                 resamples, seed)}
        for name, _, _ in DEPTHS
    ]
    out["by_task"] = [
        {"task_id": task, **{k: v for k, v in _rates(rs, 0, seed).items()
                             if k not in ("ci_low", "ci_high", "n_tasks", "net_ci_low",
                                          "net_ci_high", "diff_ci_low", "diff_ci_high",
                                          "few_tasks")}}
        for task, rs in sorted(_by_task(rows).items())
    ]
    judged = [r for r in rows if r.a_corrected is not None and r.b_corrected is not None]
    if judged:
        out["correction"] = {
            "a_rate": _mean([r.a_corrected or 0.0 for r in judged]),
            "b_rate": _mean([r.b_corrected or 0.0 for r in judged]),
            "n_states": len(judged),
        }
    return out


@dataclass(frozen=True)
class Continued:
    """One state played on to the end by each policy: the share of runs that succeeded."""

    task_id: str
    a_success: float
    b_success: float


def summarize_continuation(rows: Sequence[Continued], resamples: int = 1000,
                           seed: int = 0) -> dict[str, Any]:
    """A's and B's terminal success from the same states; the CI is of A − B."""
    if not rows:
        return {"a_success": None, "b_success": None, "ci_low": None, "ci_high": None,
                "n_states": 0, "n_tasks": 0, "few_tasks": False}
    groups: dict[str, list[Continued]] = defaultdict(list)
    for r in rows:
        groups[r.task_id].append(r)
    lo, hi = bootstrap(groups, lambda rs: _mean([r.a_success - r.b_success for r in rs]),
                       resamples, seed)
    return {"a_success": _mean([r.a_success for r in rows]),
            "b_success": _mean([r.b_success for r in rows]),
            "ci_low": lo, "ci_high": hi, "n_states": len(rows), "n_tasks": len(groups),
            "few_tasks": len(groups) < FEW_TASKS}
