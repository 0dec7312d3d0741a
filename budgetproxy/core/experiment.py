"""Live experiments: which arm a new episode gets, and the experiment's state from its outcomes."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from budgetproxy.config import ArmConfig, ExperimentConfig
from budgetproxy.core.budget import _unit_draw
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
    success: bool | None  # None: abandoned (left out of the tally)
    ended_at: str  # RFC 3339, the episode record's; the finishing order is (ended_at, id)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.episode_id, "task": self.task_id, "arm": self.arm,
                "success": self.success, "ended_at": self.ended_at}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Finished:
        return cls(str(d["id"]), d.get("task"), str(d["arm"]), d.get("success"),
                   str(d["ended_at"]))


def outcome_of(end_reason: str | None) -> bool | None:
    """The success metric of an ended episode; None for an abandoned one."""
    if end_reason is None or end_reason == "abandoned":
        return None
    return end_reason == "success"


def _difference(seq: DifferenceSequence | None) -> dict[str, float | None]:
    if seq is None:
        return {"estimate": None, "cs_low": -1.0, "cs_high": 1.0, "pairs": 0}
    iv = seq.interval()
    return {"estimate": iv.estimate, "cs_low": iv.low, "cs_high": iv.high, "pairs": iv.n}


def experiment_view(exp: ExperimentConfig, finished: Iterable[Finished],
                    stopped: Decision | None = None) -> dict[str, Any]:
    """The experiment's state from its finished episodes (any order: they are sorted into
    finishing order here, so the API and `analyze` agree on the same episodes).

    `difference` is first arm minus second, with a confidence sequence at `alpha` split over
    the comparisons (every arm after the first against the first: `comparisons`).
    """
    names = [a.name for a in exp.arms]
    index = {n: i for i, n in enumerate(names)}
    ordered = sorted(finished, key=lambda f: (f.ended_at, f.episode_id))
    counts = [[0, 0, 0] for _ in names]  # episodes, successes, left out
    outcomes: list[tuple[str | None, int, float]] = []
    for f in ordered:
        i = index.get(f.arm)
        if i is None:  # an arm since removed from the config
            continue
        if f.success is None:
            counts[i][2] += 1
            continue
        counts[i][0] += 1
        counts[i][1] += f.success
        outcomes.append((f.task_id, i, 1.0 if f.success else 0.0))
    arms = [{"name": n, "episodes": c[0], "successes": c[1],
             "estimate": c[1] / c[0] if c[0] else None, "left_out": c[2]}
            for n, c in zip(names, counts, strict=True)]
    alpha = exp.alpha / (len(names) - 1)
    comparisons = []
    for j in range(1, len(names)):
        seq = DifferenceSequence(alpha)
        for y_a, y_b in paired(outcomes, 0, j, by_task=exp.unit != "task"):
            seq.add(y_a, y_b)
        diff = _difference(seq)
        low, high = float(diff["cs_low"] or 0.0), float(diff["cs_high"] or 0.0)
        comparisons.append({"a": names[0], "b": names[j], "difference": diff,
                            "decision": decide(low, high, exp.min_effect)})
    first = comparisons[0]
    return {
        "name": exp.name,
        "unit": exp.unit,
        "metric": exp.metric,
        "alpha": exp.alpha,
        "min_effect": exp.min_effect,
        "arms": arms,
        "difference": first["difference"],
        "decision": first["decision"],
        "comparisons": comparisons,
        "stopped": stopped,
    }


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


def settings_record(exp: ExperimentConfig) -> dict[str, Any]:
    """What `analyze --experiment` needs of the config, as the log's experiment record."""
    return {"name": exp.name, "unit": exp.unit, "metric": exp.metric, "alpha": exp.alpha,
            "min_effect": exp.min_effect, "stop": exp.stop, "on_stop": exp.on_stop,
            "arms": [a.model_dump(exclude_none=True) for a in exp.arms]}


def experiment_from_record(record: dict[str, Any]) -> ExperimentConfig:
    keep = ("name", "unit", "metric", "alpha", "min_effect", "stop", "on_stop", "arms")
    return ExperimentConfig.model_validate({k: record[k] for k in keep if k in record})


def arm_names(exp: ExperimentConfig) -> Sequence[str]:
    return [a.name for a in exp.arms]
