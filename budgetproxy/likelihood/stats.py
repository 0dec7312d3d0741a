"""Likelihood statistics: per-step NLL, trajectory log-likelihood ratios, length-matched pairs,
each with a percentile bootstrap CI over tasks (tasks resampled with replacement)."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from budgetproxy.analysis.stats import FEW_TASKS

T = TypeVar("T")


@dataclass(frozen=True)
class StepScore:
    """One logged action scored under the reference."""

    task_id: str
    side: str  # "a" | "b": whose action
    nll: float  # −log π_ref(action | state), nats
    tokens: int


@dataclass(frozen=True)
class TrajectoryScore:
    """One trajectory: its reference NLL, its log π_policy(τ)/π_ref(τ), its length."""

    task_id: str
    side: str
    episode_id: str
    success: bool | None  # None: abandoned, no outcome
    ref_nll: float  # Σ −log π_ref over its actions
    llr: float | None  # Σ log π_policy − log π_ref; None when the policy's were not had
    tokens: int  # its actions' tokens under the reference's tokenizer


def bootstrap(groups: Mapping[str, Sequence[T]], stat: Callable[[list[T]], float | None],
              resamples: int, seed: int, confidence: float = 0.95,
              ) -> tuple[float | None, float | None]:
    """Percentile CI of `stat` over the pooled rows of tasks drawn with replacement (tasks in
    sorted order, so a log gives the same interval whatever its line order); resamples where
    `stat` is undefined (None) are skipped."""
    tasks = sorted(groups)
    if not tasks or resamples < 1:
        return None, None
    rng = random.Random(seed)
    values = []
    for _ in range(resamples):
        rows: list[T] = []
        for t in rng.choices(tasks, k=len(tasks)):
            rows.extend(groups[t])
        v = stat(rows)
        if v is not None:
            values.append(v)
    if not values:
        return None, None
    values.sort()
    alpha = (1 - confidence) / 2
    return (values[min(len(values) - 1, int(alpha * len(values)))],
            values[min(len(values) - 1, int((1 - alpha) * len(values)))])


def by_task(rows: Iterable[T], task: Callable[[T], str]) -> dict[str, list[T]]:
    groups: dict[str, list[T]] = defaultdict(list)
    for r in rows:
        groups[task(r)].append(r)
    return dict(groups)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _quantile(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def per_step(steps: Sequence[StepScore], resamples: int, seed: int) -> dict[str, Any]:
    """Mean NLL per action under the reference, its CI, and the spread of the values."""
    groups = by_task(steps, lambda s: s.task_id)
    lo, hi = bootstrap(groups, lambda rs: _mean([r.nll for r in rs]), resamples, seed)
    nll = [s.nll for s in steps]
    tokens = sum(s.tokens for s in steps)
    return {"nll_mean": _mean(nll), "ci_low": lo, "ci_high": hi, "n": len(steps),
            "n_tasks": len(groups), "few_tasks": len(groups) < FEW_TASKS,
            "nll_per_token": sum(nll) / tokens if tokens else None, "tokens": tokens,
            "quantiles": {f"p{int(100 * q)}": _quantile(nll, q) for q in (0.1, 0.5, 0.9)}
            if nll else None}


def step_difference(steps: Sequence[StepScore], resamples: int, seed: int) -> dict[str, Any]:
    """Mean NLL of A's actions minus B's, with a CI over the tasks either has."""
    def diff(rows: Sequence[StepScore]) -> float | None:
        a = _mean([r.nll for r in rows if r.side == "a"])
        b = _mean([r.nll for r in rows if r.side == "b"])
        return None if a is None or b is None else a - b

    groups = by_task(steps, lambda s: s.task_id)
    lo, hi = bootstrap(groups, diff, resamples, seed)
    return {"nll_diff": diff(steps), "ci_low": lo, "ci_high": hi, "n_tasks": len(groups),
            "few_tasks": len(groups) < FEW_TASKS}


def llr_summary(trajs: Sequence[TrajectoryScore], resamples: int, seed: int) -> dict[str, Any]:
    """Mean log π_policy(τ)/π_ref(τ) over trajectories that have it, with its CI."""
    had = [t for t in trajs if t.llr is not None]
    groups = by_task(had, lambda t: t.task_id)
    lo, hi = bootstrap(groups, lambda rs: _mean([r.llr or 0.0 for r in rs]), resamples, seed)
    return {"llr_mean": _mean([t.llr or 0.0 for t in had]), "ci_low": lo, "ci_high": hi,
            "n": len(had), "n_tasks": len(groups), "few_tasks": len(groups) < FEW_TASKS,
            "tokens_mean": _mean([float(t.tokens) for t in had])}


def within(a: int, b: int, tolerance: float) -> bool:
    """Lengths that differ by at most `tolerance` of the longer."""
    return abs(a - b) <= tolerance * max(a, b)


def match_pairs(trajs: Sequence[TrajectoryScore], tolerance: float,
                ) -> list[tuple[TrajectoryScore, TrajectoryScore]]:
    """One-to-one pairs of an A and a B trajectory of the same task whose lengths are within
    `tolerance`: per task, the closest lengths first (ties by episode id), each trajectory in
    at most one pair."""
    out = []
    for _, rows in sorted(by_task(trajs, lambda t: t.task_id).items()):
        a = [t for t in rows if t.side == "a"]
        b = [t for t in rows if t.side == "b"]
        candidates = sorted(
            ((abs(x.tokens - y.tokens), x.episode_id, y.episode_id, x, y)
             for x in a for y in b if within(x.tokens, y.tokens, tolerance)),
            key=lambda c: c[:3])
        used: set[str] = set()
        for _, ea, eb, x, y in candidates:
            if ea not in used and eb not in used:
                used.update((ea, eb))
                out.append((x, y))
    return out


def length_matched(pairs: Sequence[tuple[TrajectoryScore, TrajectoryScore]], tolerance: float,
                   resamples: int, seed: int) -> dict[str, Any]:
    """Over matched pairs: A's trajectory LLR minus B's (diff_nats), and A's reference NLL
    minus B's, each with its CI over tasks."""
    with_llr = [(x, y) for x, y in pairs if x.llr is not None and y.llr is not None]
    groups = by_task(with_llr, lambda p: p[0].task_id)
    lo, hi = bootstrap(groups, lambda ps: _mean([(x.llr or 0.0) - (y.llr or 0.0)
                                                 for x, y in ps]), resamples, seed)
    all_groups = by_task(pairs, lambda p: p[0].task_id)
    nll_lo, nll_hi = bootstrap(all_groups, lambda ps: _mean([x.ref_nll - y.ref_nll
                                                            for x, y in ps]), resamples, seed)
    return {
        "diff_nats": _mean([(x.llr or 0.0) - (y.llr or 0.0) for x, y in with_llr]),
        "ci_low": lo, "ci_high": hi, "n_pairs": len(with_llr), "n_tasks": len(groups),
        "few_tasks": len(groups) < FEW_TASKS, "tolerance": tolerance,
        "ref_nll_diff_nats": _mean([x.ref_nll - y.ref_nll for x, y in pairs]),
        "ref_nll_ci_low": nll_lo, "ref_nll_ci_high": nll_hi, "n_pairs_ref": len(pairs),
        "a_tokens_mean": _mean([float(x.tokens) for x, _ in pairs]),
        "b_tokens_mean": _mean([float(y.tokens) for _, y in pairs]),
    }
