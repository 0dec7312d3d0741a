"""Consumers of finished work: trajectory records and metrics for turns and episodes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from budgetproxy.core import axes
from budgetproxy.core.budget import tier_label
from budgetproxy.core.episode import EpisodeState
from budgetproxy.telemetry.metrics import Metrics
from budgetproxy.trajectories.records import SCHEMA_VERSION, rfc3339
from budgetproxy.trajectories.sink import NullSink, TrajectorySink


def strip_text(value: Any) -> Any:
    """content: none — texts out, lengths kept."""
    if isinstance(value, str):
        return {"length": len(value)}
    if isinstance(value, list):
        return [strip_text(v) for v in value]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if k in ("content", "text", "arguments", "input", "output") and v is not None:
                out[k] = strip_text(v)
            elif isinstance(v, dict | list):
                out[k] = strip_text(v)
            else:
                out[k] = v
        return out
    return value


class Recorder:
    """Turns finished turns and episodes into log records and metric updates."""

    # The full budgets of the axes beside turns that BudgetMix draws over (the base of their
    # tiers in `analyze --axis X --tiers`), as episode record fields: full_token_budget ...
    full_budgets: dict[str, float] = {}  # noqa: RUF012 (replaced, never mutated)

    def __init__(self, sink: TrajectorySink, metrics: Metrics | None, content_full: bool) -> None:
        self.sink = sink
        self.metrics = metrics
        self.content_full = content_full
        # With trajectories off, a turn's record is not even built (~13 us a call).
        self.writes_turns = not isinstance(sink, NullSink)
        # Whether anything is kept of a turn (a subclass may keep turns without the log).
        self.keeps_turns = self.writes_turns
        # What others keep per episode in this process for its next turn, to forget when it
        # ends (called with the episode's id; proxy/turns.py's conversations, say).
        self.forget: list[Callable[[str], None]] = []

    def labels(self, st: EpisodeState) -> tuple[str, str]:
        return tier_label(st.budget, st.max_turns), st.disclosure

    async def episode_started(self, st: EpisodeState) -> None:
        if self.metrics is not None:
            labels = self.labels(st)
            self.metrics.touch_episode_labels(*labels)
            self.metrics.episodes_started.labels(*labels).inc()
            self.metrics.active_episodes.inc()
            tenant = self.metrics.tenant_label(st.episode_id)
            if tenant is not None:
                self.metrics.tenant_episodes_started.labels(tenant).inc()

    async def episode_ended(self, st: EpisodeState) -> None:
        for forget in self.forget:
            forget(st.episode_id)
        tier, arm = self.labels(st)
        reason = st.end_reason or "abandoned"
        if self.metrics is not None:
            m = self.metrics
            m.episodes_finished.labels(tier, arm, reason).inc()
            success_turn = st.settled_success_turn
            used = success_turn if reason == "success" and success_turn else st.turns_used
            m.episode_turns.labels(tier, arm, reason).observe(used)
            if reason == "exhausted":
                m.episodes_exhausted.labels(tier, arm, st.spent_axis or "turns").inc()
            if axes.has_axes(st):
                end = st.ended_at or time.time()
                m.episode_tokens.labels(tier, arm, reason).observe(st.tokens_used)
                m.episode_seconds.labels(tier, arm, reason).observe(axes.time_used(st, end))
                if st.cost_budget is not None:
                    m.episode_cost.labels(tier, arm, reason).observe(st.cost_used)
            m.active_episodes.dec()
            tenant = m.tenant_label(st.episode_id)
            if tenant is not None:
                m.tenant_episodes_finished.labels(tenant, reason).inc()
        await self.sink.put(
            {
                "schema": SCHEMA_VERSION,
                "type": "episode",
                "episode_id": st.episode_id,
                "task_id": st.task_id,
                "group": st.group,
                "tags": st.tags,
                "model": st.model,
                "budget": st.budget,
                "max_turns": st.max_turns,
                "tier": tier,
                "disclosure": arm,
                "announced_budget": st.announced_budget,
                "min_turns": st.min_turns,
                "turns_used": st.turns_used,
                "outcome": st.outcome,
                "success_turn": st.settled_success_turn,
                "reward": st.reward,
                "exhausted": st.exhausted,
                "end_reason": reason,
                "started_at": rfc3339(st.created_at),
                "ended_at": rfc3339(st.ended_at or time.time()),
                "metadata": st.metadata,
                **axes.view(st, time.time()),
                **self.full_budgets,
                # (an episode in a live experiment: the experiment and its arm)
                **({} if st.experiment is None else {
                    "experiment": st.experiment, "arm": st.arm}),
            }
        )

    async def probe(self, record: dict[str, Any]) -> None:
        """A probe call's record (never an episode's turn), texts left out as turns' are."""
        await self.turn(record)

    async def turn(self, record: dict[str, Any]) -> None:
        """Log a turn's record."""
        if not self.content_full:
            for key in ("request_messages", "response"):
                if record.get(key) is not None:
                    record[key] = strip_text(record[key])
            if record.get("disclosure", {}).get("text") is not None:
                record["disclosure"]["text"] = strip_text(record["disclosure"]["text"])
        await self.sink.put(record)  # queue depth is sampled by the sweeper, not per turn
