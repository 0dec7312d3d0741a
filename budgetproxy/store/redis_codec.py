"""An episode as a Redis hash: which field holds what, and how each value is written."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import orjson

from budgetproxy.core.episode import EpisodeState

# How each EpisodeState field is kept in the hash. None is an absent field.
_INT, _FLOAT, _BOOL, _STR, _JSON = "int", "float", "bool", "str", "json"
_CODEC: dict[str, str] = {
    "episode_id": _STR, "budget": _INT, "max_turns": _INT, "disclosure": _STR,
    "task_id": _STR, "group": _STR, "announced_budget": _INT, "tags": _JSON,
    "created_at": _FLOAT, "last_activity": _FLOAT, "model": _STR, "turns_used": _INT,
    "inflight": _INT, "last_turn": _INT, "last_attempt": _INT, "last_hash": _STR,
    "last_state": _STR, "last_charged": _BOOL, "free_retries_used": _INT, "refused": _BOOL,
    "disclosed_at": _JSON, "messages_seen": _INT, "messages_digest": _STR, "status": _STR,
    "outcome": _STR, "success_turn": _INT, "reward": _JSON, "metadata": _JSON,
    "end_reason": _STR, "ended_at": _FLOAT, "end_pending": _BOOL,
    "token_budget": _INT, "cost_budget": _FLOAT, "time_budget_s": _FLOAT,
    "announced_tokens": _INT, "announced_cost": _FLOAT, "announced_time_s": _FLOAT,
    "tokens_used": _INT, "cost_used": _FLOAT, "tokens_reserved": _INT, "cost_reserved": _FLOAT,
    "first_call_at": _FLOAT, "exhausted_by": _STR, "told": _JSON, "min_turns": _INT,
    "experiment": _STR, "arm": _STR,
}


def _encode_value(kind: str, value: Any) -> str | bytes:
    if kind == _INT:
        return str(int(value))
    if kind == _FLOAT:
        return repr(float(value))  # repr round-trips a float exactly
    if kind == _BOOL:
        return "1" if value else "0"
    if kind == _JSON:
        return orjson.dumps(value)
    return str(value)


# Hash fields named otherwise than the EpisodeState field. A turn keeps its placements in a
# list beside the hash (store/redis.py), read and written at its end; in the hash, under a
# name of their own, are only those an older version kept there (or an episode was created
# with), which the next turn moves to the list (open_turn.lua). Versions that read
# `disclosed_at` as [index, turn] pairs (and require the field) still find it, empty, during
# a rolling deploy; each version re-applies only the placements it can read.
_FIELD = {"disclosed_at": "placements"}
_LEGACY = ["disclosed_at", "[]"]


# The axis fields (core.axes) and their values in an episode without budgets beside turns.
_NO_AXES: dict[str, Any] = {
    "token_budget": None, "cost_budget": None, "time_budget_s": None, "announced_tokens": None,
    "announced_cost": None, "announced_time_s": None, "tokens_used": 0, "cost_used": 0.0,
    "tokens_reserved": 0, "cost_reserved": 0.0, "first_call_at": None, "exhausted_by": None,
}


# (EpisodeState's field, its hash field, how it is written), in the dataclass's order; told is
# left out: one hash field per turn (RedisStore.keep_told), none at creation
_FIELDS = [(f.name, _FIELD.get(f.name, f.name), _CODEC[f.name])
           for f in fields(EpisodeState) if f.name != "told"]


def encode_state(st: EpisodeState) -> list[str | bytes]:
    """The episode as flat hash field/value pairs (None fields left out, and the axis fields
    of an episode with no budget beside turns)."""
    out: list[str | bytes] = []
    turn_only = st.token_budget is None and st.cost_budget is None and st.time_budget_s is None
    for name, field, kind in _FIELDS:
        value = getattr(st, name)
        if (value is None or (turn_only and name in _NO_AXES)
                or (name == "disclosed_at" and not value)):
            continue
        out.append(field)
        out.append(_encode_value(kind, value))
    out += _LEGACY
    return out


def _opt_int(raw: str | None) -> int | None:
    return None if raw is None else int(raw)


def _opt_float(raw: str | None) -> float | None:
    return None if raw is None else float(raw)


def decode_state(pairs: list[str]) -> EpisodeState:
    """An episode from flat field/value pairs, as HGETALL (or a script's snapshot) gives them.

    Written out field by field, and built like `EpisodeState.snapshot` (no __init__): it runs
    twice per turn.
    """
    d = dict(zip(pairs[::2], pairs[1::2], strict=True))
    g = d.get
    reward, ended_at = g("reward"), g("ended_at")
    st = object.__new__(EpisodeState)
    st.__dict__.update(
        episode_id=d["episode_id"],
        budget=int(d["budget"]),
        max_turns=_opt_int(g("max_turns")),
        disclosure=d["disclosure"],
        task_id=g("task_id"),
        group=g("group"),
        announced_budget=_opt_int(g("announced_budget")),
        min_turns=_opt_int(g("min_turns")),
        tags=orjson.loads(d["tags"]),
        created_at=float(d["created_at"]),
        last_activity=float(d["last_activity"]),
        model=g("model"),
        turns_used=int(d["turns_used"]),
        inflight=int(d["inflight"]),
        last_turn=int(d["last_turn"]),
        last_attempt=int(d["last_attempt"]),
        last_hash=g("last_hash"),
        last_state=d["last_state"],
        last_charged=d["last_charged"] == "1",
        free_retries_used=int(d["free_retries_used"]),
        refused=d["refused"] == "1",
        disclosed_at=orjson.loads(g("placements") or "[]"),
        messages_seen=int(d["messages_seen"]),
        messages_digest=g("messages_digest"),
        status=d["status"],
        outcome=g("outcome"),
        success_turn=_opt_int(g("success_turn")),
        reward=None if reward is None else orjson.loads(reward),
        metadata=orjson.loads(d["metadata"]),
        end_reason=g("end_reason"),
        ended_at=None if ended_at is None else float(ended_at),
        end_pending=g("end_pending") == "1",  # absent in episodes stored by older versions
    )
    # Budgets beside turns (core.axes): a turn-only episode stores none of their fields
    # (encode_state), so it takes the defaults without a lookup each.
    if "token_budget" in d or "cost_budget" in d or "time_budget_s" in d:
        st.__dict__.update(
            token_budget=_opt_int(g("token_budget")),
            cost_budget=_opt_float(g("cost_budget")),
            time_budget_s=_opt_float(g("time_budget_s")),
            announced_tokens=_opt_int(g("announced_tokens")),
            announced_cost=_opt_float(g("announced_cost")),
            announced_time_s=_opt_float(g("announced_time_s")),
            tokens_used=int(g("tokens_used") or 0),
            cost_used=float(g("cost_used") or 0.0),
            tokens_reserved=int(g("tokens_reserved") or 0),
            cost_reserved=float(g("cost_reserved") or 0.0),
            first_call_at=_opt_float(g("first_call_at")),
            exhausted_by=g("exhausted_by"),
            told={k[5:]: v for k, v in d.items() if k.startswith("told:")} or None,
        )
    # else: a turn-only episode reads the axis fields' defaults from the class (they are plain
    # values there), without a write each
    if "experiment" in d or "arm" in d:  # (one in no experiment reads the class's None)
        st.__dict__.update(experiment=g("experiment"), arm=g("arm"))
    return st
