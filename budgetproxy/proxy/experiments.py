"""Live experiments at the edge: an episode's arm at admission, its outcome when it ends, and
the experiment's state (view, gauges, the automatic stop) from what the store keeps."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from budgetproxy.config import ArmConfig, Config, ExperimentConfig
from budgetproxy.core.episode import EpisodeState
from budgetproxy.core.experiment import (
    DECISION_RECORD,
    apply_arm,
    block_arm,
    draw_arm,
    experiment_view,
    finished_of,
    kept_unit,
    settings_record,
    stopped_arm,
    stratum,
)
from budgetproxy.core.sequential import Decision
from budgetproxy.core.spec import EpisodeSpec
from budgetproxy.errors import invalid_request
from budgetproxy.store.base import StoreUnavailable
from budgetproxy.store.experiments import ExperimentStore
from budgetproxy.telemetry.metrics import Metrics
from budgetproxy.trajectories.records import SCHEMA_VERSION, rfc3339
from budgetproxy.trajectories.sink import TrajectorySink

log = logging.getLogger("budgetproxy")

EXPERIMENT_HEADER = b"x-episode-experiment"
# How long a replica trusts that a `stop: auto` experiment has not stopped before asking the
# store again (the creation of its episodes reads it).
STOP_RECHECK_S = 1.0


@dataclass(frozen=True)
class Assigned:
    experiment: str
    arm: ArmConfig


class NeedArm(Exception):
    """A new episode names an experiment: its arm is drawn (from the store) before it is
    created. Raised from a store's `fresh()`, which then stores nothing."""

    def __init__(self, experiment: ExperimentConfig, spec: EpisodeSpec) -> None:
        super().__init__(experiment.name)
        self.experiment, self.spec = experiment, spec


class Experiments:
    """The configured experiments of one process, over a store shared by replicas."""

    def __init__(self, config: Config, store: ExperimentStore, sink: TrajectorySink,
                 metrics: Metrics | None) -> None:
        self.by_name = {e.name: e for e in config.experiments}
        self.seed = config.budget.seed
        self.on_exhausted = config.reward.on_exhausted
        self.store = store
        self.sink = sink
        self.metrics = metrics
        # name -> (decision or None, when it was read), for stop: auto experiments
        self._stops: dict[str, tuple[Decision | None, float]] = {}
        if metrics is not None and self.by_name:
            metrics.enable_experiments({
                n: ([a.name for a in e.arms], e.bounds[1] - e.bounds[0])
                for n, e in self.by_name.items()})

    def named(self, raw: bytes | str,
              source: str = "Header X-Episode-Experiment") -> ExperimentConfig:
        """The experiment a first call names; a name no experiment has is a 400 naming it."""
        name = (raw.decode("latin-1") if isinstance(raw, bytes) else raw).strip()
        exp = self.by_name.get(name)
        if exp is None:
            known = ", ".join(sorted(self.by_name)) or "none are configured"
            raise invalid_request(f"{source} names no configured experiment: {name!r} "
                                  f"(experiments: {known})", "experiment")
        return exp

    async def stop_of(self, exp: ExperimentConfig) -> Decision | None:
        """The decision that stopped a `stop: auto` experiment (None while it runs)."""
        if exp.stop != "auto":
            return None
        now = time.monotonic()
        known = self._stops.get(exp.name)
        if known is not None and (known[0] is not None or now - known[1] < STOP_RECHECK_S):
            return known[0]
        try:
            decision = await self.store.stopped(exp.name)
        except StoreUnavailable:  # assignment goes on as drawn; the stop is seen later
            return None if known is None else known[0]
        self._stops[exp.name] = (decision, now)
        return decision

    async def assign(self, exp: ExperimentConfig,
                     spec: EpisodeSpec) -> tuple[EpisodeSpec, Assigned]:
        """A new episode's arm, and its spec with the arm applied: after a stop the stopped
        arm; else its unit's arm, or the next of its stratum's permuted blocks (the draw from
        values alone while the store is unavailable)."""
        stop = await self.stop_of(exp)
        if stop is not None:
            index = stopped_arm(exp, stop)
        else:
            where = stratum(exp, spec)
            try:
                index = await self.store.assign(
                    exp.name, where, kept_unit(exp, spec),
                    lambda n: block_arm(self.seed, exp, where, n))
            except StoreUnavailable:
                index = draw_arm(self.seed, exp, spec)
        arm = exp.arms[index]
        return apply_arm(spec, arm), Assigned(exp.name, arm)

    def arm_of(self, st: EpisodeState) -> ArmConfig | None:
        exp = self.by_name.get(st.experiment or "")
        if exp is None:
            return None
        return next((arm for arm in exp.arms if arm.name == st.arm), None)

    def template_of(self, st: EpisodeState) -> str | None:
        """The disclosure template of the episode's arm, when the arm sets one."""
        arm = self.arm_of(st)
        return None if arm is None else arm.template

    def model_of(self, st: EpisodeState) -> str | None:
        """The model the episode's arm calls instead of the one asked for, if any."""
        arm = self.arm_of(st)
        return None if arm is None else arm.model

    async def ended(self, st: EpisodeState) -> None:
        """Keep an experiment episode's outcome (once per episode, as its record is written)."""
        if st.experiment is None or st.experiment not in self.by_name or st.arm is None:
            return
        entry = finished_of(self.by_name[st.experiment], st.arm, _record_fields(st),
                            self.on_exhausted)
        try:
            await self.store.add(st.experiment, entry)
        except StoreUnavailable:
            log.warning("store unavailable: the outcome of %s is missing from experiment %s "
                        "(its record has it)", st.episode_id, st.experiment)

    async def view(self, exp: ExperimentConfig) -> dict[str, Any]:
        """The experiment's state now, from the store; its gauges follow."""
        finished = await self.store.finished(exp.name)
        stopped = await self.store.stopped(exp.name)
        view = experiment_view(exp, finished, stopped)
        if self.metrics is not None:
            self.metrics.set_experiment(view)
        return view

    async def review(self) -> None:
        """Refresh every experiment's gauges and stop a `stop: auto` one that has decided
        (the replica that stops it writes the decision record)."""
        for exp in self.by_name.values():
            view = await self.view(exp)
            if exp.stop != "auto" or view["stopped"] is not None:
                continue
            decision: Decision = view["decision"]
            if decision == "continue" or not await self.store.stop(exp.name, decision):
                continue
            self._stops[exp.name] = (decision, time.monotonic())
            log.info("experiment %s stopped: %s", exp.name, decision)
            await self.sink.put({
                "schema": SCHEMA_VERSION, "type": DECISION_RECORD, "ts": rfc3339(time.time()),
                "experiment": exp.name, "decision": decision,
                "next_arm": exp.arms[stopped_arm(exp, decision)].name,
                "arms": view["arms"], "difference": view["difference"],
            })

    async def write_settings(self) -> None:
        """One `experiment` record per configured experiment, for `analyze --experiment`."""
        for exp in self.by_name.values():
            await self.sink.put({"schema": SCHEMA_VERSION, "type": "experiment",
                                 "ts": rfc3339(time.time()),
                                 **settings_record(exp, self.on_exhausted)})


def _record_fields(st: EpisodeState) -> dict[str, Any]:
    """The fields of the episode's record a metric reads, as the record has them (so the
    outcome kept here is the one `analyze` reads back from the log)."""
    return {"episode_id": st.episode_id, "task_id": st.task_id,
            "ended_at": rfc3339(st.ended_at or time.time()),
            "end_reason": st.end_reason or "abandoned", "outcome": st.outcome,
            "reward": st.reward, "max_turns": st.max_turns,
            "success_turn": st.settled_success_turn, "turns_used": st.turns_used,
            "token_budget": st.token_budget, "tokens_used": st.tokens_used,
            "cost_budget": st.cost_budget, "cost_used": round(st.cost_used, 9)}
