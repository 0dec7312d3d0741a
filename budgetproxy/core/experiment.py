"""Live experiments: which arm a new episode gets, and the experiment's state from its outcomes."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from budgetproxy.config import ArmConfig, ExperimentConfig
from budgetproxy.core.budget import _unit_draw, round_half_up
from budgetproxy.core.rewards import OnExhausted, final_reward
from budgetproxy.core.sequential import Decision, DifferenceSequence, decide, paired
from budgetproxy.core.spec import EpisodeSpec

# The record type of an experiment's stop (stop: auto), written once across replicas.
DECISION_RECORD = "experiment_decision"


def unit_key(exp: ExperimentConfig, spec: EpisodeSpec) -> tuple[str, ...]:
    """What shares an arm: the task, the (task, group), or the episode. An episode lacking
    its unit's id (no task id in a task experiment) is a unit of its own."""
    if exp.unit == "task" and spec.task_id is not None:
        return ("task", spec.task_id)
    if exp.unit == "group" and spec.group is not None:
        return ("group", spec.task_id or "", spec.group)
    return ("episode", spec.episode_id)


def draw_arm(seed: int, exp: ExperimentConfig, spec: EpisodeSpec) -> int:
    """The unit's arm drawn from values alone: uniform over the arms, fixed by (seed,
    experiment, unit). Used when the store cannot count (block_arm)."""
    u = _unit_draw("experiment", seed, exp.name, *unit_key(exp, spec))
    return int(u * len(exp.arms))


def stratum(exp: ExperimentConfig, spec: EpisodeSpec) -> str:
    """Whose units are balanced together: every task (unit task), or the units of one task
    (group, episode), so that a task's episodes are split evenly and pair within it."""
    return "" if exp.unit == "task" else (spec.task_id or "")


def kept_unit(exp: ExperimentConfig, spec: EpisodeSpec) -> str | None:
    """The unit whose arm the store keeps for its later episodes (a task or a group); None
    for an episode, whose own state keeps its arm."""
    key = unit_key(exp, spec)
    return None if key[0] == "episode" else "\x1f".join(key)


def block_arm(seed: int, exp: ExperimentConfig, stratum: str, index: int) -> int:
    """The arm of a stratum's index-th new unit (from 0): permuted blocks, so every k
    consecutive units get each of the k arms once, in an order fixed by (seed, experiment,
    stratum, block)."""
    k = len(exp.arms)
    block, at = divmod(index, k)
    order = sorted(range(k), key=lambda i: _unit_draw("experiment-block", seed, exp.name,
                                                      stratum, block, i))
    return order[at]


def stopped_arm(exp: ExperimentConfig, decision: Decision) -> int:
    """The arm new episodes get once `stop: auto` has decided: the better one of the first
    two (`on_stop: winner`), else the first (control; also after a futile stop)."""
    if exp.on_stop == "winner" and decision == "stop_b_better":
        return 1
    return 0


def apply_arm(spec: EpisodeSpec, arm: ArmConfig) -> EpisodeSpec:
    """The spec with the arm's settings; the arm's values win over the episode's own."""
    changes: dict[str, Any] = {}
    if arm.disclosure is not None:
        changes["disclosure"] = arm.disclosure
    if arm.announced_budget is not None:
        changes["announced_budget"] = arm.announced_budget
    if arm.budget is not None:
        changes["budget"] = arm.budget
    return dataclasses.replace(spec, **changes) if changes else spec


@dataclass(frozen=True)
class Finished:
    """One finished episode of an experiment, as the store and the log keep it."""

    episode_id: str
    task_id: str | None
    arm: str
    success: bool | None  # None: left out of the tally (abandoned, or no metric value)
    ended_at: str  # RFC 3339, the episode record's; the finishing order is (ended_at, id)
    # The metric's outcome in its units, before clipping; None: the success as 0 or 1 (the
    # success metric, and entries kept before other metrics existed).
    value: float | None = None

    @property
    def outcome(self) -> float | None:
        """The outcome the experiment counts, None when it is left out."""
        if self.success is None:
            return None
        return float(self.success) if self.value is None else self.value

    def to_json(self) -> dict[str, Any]:
        return {"id": self.episode_id, "task": self.task_id, "arm": self.arm,
                "success": self.success, "ended_at": self.ended_at, "value": self.value}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Finished:
        value = d.get("value")
        return cls(str(d["id"]), d.get("task"), str(d["arm"]), d.get("success"),
                   str(d["ended_at"]), None if value is None else float(value))


def outcome_of(end_reason: str | None) -> bool | None:
    """The success metric of an ended episode; None for an abandoned one."""
    if end_reason is None or end_reason == "abandoned":
        return None
    return end_reason == "success"


def tier_turns(tier: float, max_turns: int) -> int:
    """T of a tier in percent of max_turns: max(1, round_half_up(tier/100 x max_turns)),
    exactly (the tier read as the decimal it was written as), as `analyze` counts tiers."""
    return max(1, round_half_up(Fraction(str(tier)) / 100 * max_turns))


def finished_of(exp: ExperimentConfig, arm: str, ep: dict[str, Any],
                on_exhausted: OnExhausted) -> Finished:
    """The experiment's entry for an ended episode from the fields of its episode record
    (the proxy builds them from the episode's state, `analyze` reads them from the log): an
    episode without a value on the metric is left out like an abandoned one."""
    value = metric_value(exp, ep, on_exhausted)
    success = None if value is None else outcome_of(ep.get("end_reason"))
    return Finished(str(ep.get("episode_id")), ep.get("task_id"), arm, success,
                    str(ep.get("ended_at")), None if exp.metric == "success" else value)


def metric_value(exp: ExperimentConfig, ep: dict[str, Any],
                 on_exhausted: OnExhausted) -> float | None:
    """An ended episode's outcome on the experiment's metric, in its units and before
    clipping, from the fields of its episode record; None when it has none (abandoned,
    pass_at_tier without a max_turns, spend on an axis the episode had no budget on).

    success: 1 for end reason success, else 0. pass_at_tier: 1 when it succeeded within
    T = tier x max_turns turns (at its success turn, else at the turns it used). reward: the
    reward after the reward rule (`reward.on_exhausted`). tokens, cost: what it spent.
    """
    end_reason = ep.get("end_reason")
    success = outcome_of(end_reason)
    if success is None:
        return None
    metric = exp.metric
    if metric == "success":
        return float(success)
    if metric == "pass_at_tier":
        max_turns = ep.get("max_turns")
        if not max_turns or exp.tier is None:
            return None
        turn = ep.get("success_turn") or ep.get("turns_used") or 0
        return float(success and int(turn) <= tier_turns(exp.tier, int(max_turns)))
    if metric == "reward":
        reward = final_reward(ep.get("reward"), ep.get("outcome"), end_reason, on_exhausted)
        return None if reward is None or not math.isfinite(reward) else reward
    # The proxy counts spend on an axis only for episodes with a budget on it (core.axes):
    # without one there is no count to compare, and the episode is left out.
    if ep.get("token_budget" if metric == "tokens" else "cost_budget") is None:
        return None
    spent = ep.get("tokens_used" if metric == "tokens" else "cost_used")
    return float(spent or 0)


def _difference(seq: DifferenceSequence | None, width: float) -> dict[str, float | None]:
    """The comparison in the metric's units: the sequence runs on outcomes rescaled to
    [0, 1], so its difference and bounds are multiplied back by the range's width."""
    if seq is None:
        return {"estimate": None, "cs_low": -width, "cs_high": width, "pairs": 0}
    iv = seq.interval()
    return {"estimate": None if iv.estimate is None else iv.estimate * width,
            "cs_low": iv.low * width, "cs_high": iv.high * width, "pairs": iv.n}


def _decide(low: float, high: float, exp: ExperimentConfig) -> Decision:
    """The decision on a - b; for spend (lower is better) the better arm is the one below."""
    decision = decide(low, high, exp.min_effect)
    if exp.lower_is_better and decision == "stop_a_better":
        return "stop_b_better"
    if exp.lower_is_better and decision == "stop_b_better":
        return "stop_a_better"
    return decision


def experiment_view(exp: ExperimentConfig, finished: Iterable[Finished],
                    stopped: Decision | None = None) -> dict[str, Any]:
    """The experiment's state from its finished episodes (any order: they are sorted into
    finishing order here, so the API and `analyze` agree on the same episodes).

    Outcomes are clipped to the metric's range [low, high] and rescaled to [0, 1] for the
    confidence sequence; arms' estimates and the difference are in the metric's units.
    `difference` is first arm minus second, with a confidence sequence at `alpha` split over
    the comparisons (every arm after the first against the first: `comparisons`).
    """
    names = [a.name for a in exp.arms]
    index = {n: i for i, n in enumerate(names)}
    low, high = exp.bounds
    width = high - low
    ordered = sorted(finished, key=lambda f: (f.ended_at, f.episode_id))
    counts = [[0, 0, 0, 0] for _ in names]  # episodes, successes, left out, clipped
    totals = [0.0 for _ in names]
    outcomes: list[tuple[str | None, int, float]] = []
    for f in ordered:
        i = index.get(f.arm)
        if i is None:  # an arm since removed from the config
            continue
        y = f.outcome
        if y is None:
            counts[i][2] += 1
            continue
        clipped = min(max(y, low), high)
        counts[i][0] += 1
        counts[i][1] += bool(f.success)
        counts[i][3] += clipped != y
        totals[i] += clipped
        outcomes.append((f.task_id, i, (clipped - low) / width))
    arms = [{"name": n, "episodes": c[0], "successes": c[1],
             "estimate": t / c[0] if c[0] else None, "left_out": c[2], "clipped": c[3]}
            for n, c, t in zip(names, counts, totals, strict=True)]
    alpha = exp.alpha / (len(names) - 1)
    by_task = exp.unit != "task"
    if not by_task:
        outcomes = first_of_each_task(outcomes)
    comparisons = []
    for j in range(1, len(names)):
        seq = DifferenceSequence(alpha)
        for y_a, y_b in paired(outcomes, 0, j, by_task=by_task):
            seq.add(y_a, y_b)
        diff = _difference(seq, width)
        cs_low, cs_high = float(diff["cs_low"] or 0.0), float(diff["cs_high"] or 0.0)
        comparisons.append({"a": names[0], "b": names[j], "difference": diff,
                            "decision": _decide(cs_low, cs_high, exp)})
    first = comparisons[0]
    return {
        "name": exp.name,
        "unit": exp.unit,
        "metric": exp.metric,
        "metric_min": low,
        "metric_max": high,
        "tier": exp.tier,
        "better": "lower" if exp.lower_is_better else "higher",
        "alpha": exp.alpha,
        "min_effect": exp.min_effect,
        "arms": arms,
        "difference": first["difference"],
        "decision": first["decision"],
        "comparisons": comparisons,
        "stopped": stopped,
        "caution": caution(exp),
    }


def caution(exp: ExperimentConfig) -> str | None:
    """What makes the decision unsafe to act on before every episode has finished: arms with
    different turn budgets (a failure runs to its budget, so the longer arm's successes
    finish first, and pairs form in finishing order)."""
    if len({a.budget for a in exp.arms}) == 1:
        return None
    return ("the arms' turn budgets differ: an episode's length depends on its outcome "
            "differently in each arm, and pairs form in finishing order, so a decision read "
            "while episodes are running can favour the longer arm; read it once every "
            "episode has finished (docs/experiments.md, What it assumes)")


def first_of_each_task(outcomes: list[tuple[str | None, int, float]]
                       ) -> list[tuple[str | None, int, float]]:
    """With whole tasks as the unit, each task once: its first finished episode's outcome
    (an episode without a task is a unit of its own). A task's episodes share its arm and its
    difficulty, so they are not independent draws: counted each, pairs of a few tasks would
    converge on the gap in difficulty between the arms' tasks, not on the arms' effect."""
    seen: set[str] = set()
    out = []
    for task, arm, y in outcomes:
        if task is not None:
            if task in seen:
                continue
            seen.add(task)
        out.append((task, arm, y))
    return out


def first_stops(exp: ExperimentConfig, finished: Iterable[Finished]) -> dict[
        tuple[str, str], tuple[int, dict[str, Any]]]:
    """For each comparison (a, b), the number of finished episodes after which its decision
    was first other than continue, and the comparison then: the view read after every
    episode, in finishing order."""
    ordered = sorted(finished, key=lambda f: (f.ended_at, f.episode_id))
    found: dict[tuple[str, str], tuple[int, dict[str, Any]]] = {}
    for n in range(1, len(ordered) + 1):
        for c in experiment_view(exp, ordered[:n])["comparisons"]:
            key = (c["a"], c["b"])
            if c["decision"] != "continue" and key not in found:
                found[key] = (n, c)
        if len(found) == len(exp.arms) - 1:
            break
    return found


def settings_record(exp: ExperimentConfig, on_exhausted: OnExhausted = "keep") -> dict[str, Any]:
    """What `analyze --experiment` needs of the config, as the log's experiment record (with
    the reward rule, which the reward metric is read after)."""
    return {"name": exp.name, "unit": exp.unit, "metric": exp.metric,
            "metric_min": exp.metric_min, "metric_max": exp.metric_max, "tier": exp.tier,
            "reward_on_exhausted": on_exhausted, "alpha": exp.alpha,
            "min_effect": exp.min_effect, "stop": exp.stop, "on_stop": exp.on_stop,
            "arms": [a.model_dump(exclude_none=True) for a in exp.arms]}


def experiment_from_record(record: dict[str, Any]) -> ExperimentConfig:
    keep = ("name", "unit", "metric", "metric_min", "metric_max", "tier", "alpha",
            "min_effect", "stop", "on_stop", "arms")
    return ExperimentConfig.model_validate({k: record[k] for k in keep
                                            if record.get(k) is not None})


def arm_names(exp: ExperimentConfig) -> Sequence[str]:
    return [a.name for a in exp.arms]
