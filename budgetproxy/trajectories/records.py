"""Trajectory record types: the JSONL schema shared by the sink and the analysis."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, Literal, TypedDict

SCHEMA_VERSION = 1

TurnStatus = Literal["ok", "upstream_error", "rejected", "client_closed", "synthetic"]
EndReason = Literal["success", "failure", "exhausted", "abandoned"]


class Disclosure(TypedDict):
    arm: str
    text: str | None


class TurnRecord(TypedDict, total=False):
    schema: int
    type: Literal["turn"]
    episode_id: str
    turn: int
    attempt: int
    ts: str
    latency_s: float
    model: str | None
    route: str
    stream: bool
    status: TurnStatus
    http_status: int
    # The client messages new since the previous turn, from index `messages_offset` of the
    # conversation; 0 with the whole conversation when it is not an append-only extension
    # of the previous turn's (the client rewrote, shrank or edited its history).
    request_messages: list[Any]
    messages_offset: int
    previous_response_id: str  # only on /v1/responses calls that continue a stored response
    response: dict[str, Any] | None
    finish_reason: str | None
    usage: dict[str, Any] | None
    budget: int
    remaining: int
    charged: bool
    # spend per axis once the call settled: {turns, tokens, cost, seconds} (docs/budgets.md)
    cumulative: dict[str, Any]
    disclosure: Disclosure
    task_id: str | None
    group: str | None


class EpisodeRecord(TypedDict, total=False):
    schema: int
    type: Literal["episode"]
    episode_id: str
    task_id: str | None
    group: str | None
    tags: dict[str, Any]
    model: str | None
    budget: int
    max_turns: int | None
    tier: str
    disclosure: str
    announced_budget: int | None
    min_turns: int | None  # the task's fewest turns, as stated (analyze --ceiling)
    turns_used: int
    outcome: Literal["success", "failure"] | None
    success_turn: int | None
    reward: float | None
    exhausted: bool
    end_reason: EndReason
    started_at: str
    ended_at: str
    metadata: dict[str, Any]
    # budgets beside turns (docs/budgets.md); null budgets: no cap on that axis
    token_budget: int | None
    tokens_used: int
    cost_budget: float | None
    cost_used: float
    time_budget_s: float | None
    time_used_s: float
    exhausted_by: Literal["turns", "tokens", "cost", "time"] | None
    announced_tokens: int | None
    announced_cost: float | None
    announced_time_s: float | None
    # BudgetMix's full budgets beside turns (present only when configured)
    full_token_budget: int
    full_cost_budget: float
    full_time_budget_s: float


@lru_cache(maxsize=4)
def _whole_second(sec: int) -> str:
    return datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%S")


# The last millisecond written and its text: turns end several to a millisecond under load,
# and each is stamped with the time it ended. One tuple, swapped whole: threads read a pair.
_last_ms: tuple[int, str] = (-1, "")


_MILLIS = tuple(f".{frac:03d}Z" for frac in range(1000))  # (no formatting per record)


def rfc3339(ts: float) -> str:
    """RFC 3339 UTC timestamp with millisecond precision, e.g. 2026-11-30T10:04:15.123Z
    (rounded to the microsecond, then cut to the millisecond)."""
    global _last_ms
    ms = round(ts * 1_000_000) // 1000
    last, text = _last_ms
    if ms == last:
        return text
    sec, frac = divmod(ms, 1000)
    text = _whole_second(sec) + _MILLIS[frac]
    _last_ms = (ms, text)
    return text
