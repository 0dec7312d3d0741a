"""`budgetproxy export`: trajectory logs as one row per episode for RL trainers (Parquet/JSONL).

Logs are read with the analysis readers (DuckDB). Every field of the episode record is a
column (docs/rollouts.md has the schema: `COLUMNS` in order), beside what the export derives:
reported_reward and reward (after the budget rule), advantage (GRPO, over the episodes of
(task_id, group) in the logs), messages (the conversation as the model saw it, its last reply
included), and, from captured turns: turn_prompt_token_ids, turn_completion_token_ids,
turn_logprobs (per turn), append_only, and for an append-only episode token_ids, loss_mask
(1 on sampled tokens) and logprobs (null on prompt tokens).
"""

from __future__ import annotations

import json
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from budgetproxy.analysis.load import AXIS_FIELDS
from budgetproxy.core import disclosure
from budgetproxy.core.disclosure import Placement
from budgetproxy.core.rewards import OnExhausted, advantages, final_reward
from budgetproxy.core.tokens import last_attempts, sequence

MESSAGE = ("STRUCT(role VARCHAR, content VARCHAR, tool_calls VARCHAR, tool_call_id VARCHAR, "
           "name VARCHAR)")
# The episode record's fields, as the episodes table types them (tags and metadata: JSON
# objects as text, for a column that any reader takes whatever their keys).
RECORD_COLUMNS = {
    "episode_id": "VARCHAR", "task_id": "VARCHAR", "group": "VARCHAR", "model": "VARCHAR",
    "tags": "VARCHAR", "budget": "BIGINT", "max_turns": "BIGINT", "tier": "VARCHAR",
    "disclosure": "VARCHAR", "announced_budget": "BIGINT", "min_turns": "BIGINT",
    "turns_used": "BIGINT",
    "outcome": "VARCHAR", "success_turn": "BIGINT", "exhausted": "BOOLEAN",
    "end_reason": "VARCHAR", "started_at": "TIMESTAMPTZ", "ended_at": "TIMESTAMPTZ",
    "duration_s": "DOUBLE",
    **{name: "VARCHAR" if kind == "JSON" else kind for name, kind in AXIS_FIELDS.items()},
}  # fmt: skip
COLUMNS = {
    **RECORD_COLUMNS,
    "reported_reward": "DOUBLE", "reward": "DOUBLE",
    "advantage": "DOUBLE", "messages": f"{MESSAGE}[]",
    "turn_prompt_token_ids": "BIGINT[][]", "turn_completion_token_ids": "BIGINT[][]",
    "turn_logprobs": "DOUBLE[][]", "append_only": "BOOLEAN", "token_ids": "BIGINT[]",
    "loss_mask": "TINYINT[]", "logprobs": "DOUBLE[]",
}  # fmt: skip
TOKEN_TURN_COLUMNS = {"prompt_token_ids": "BIGINT[]", "completion_token_ids": "BIGINT[]",
                      "logprobs": "DOUBLE[]"}


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def message_row(m: Any) -> dict[str, Any]:
    """A message in one fixed shape (what Parquet and `datasets` need): text content as is,
    a list of parts or tool calls as JSON text."""
    if not isinstance(m, dict):
        return {"role": None, "content": _text(m), "tool_calls": None, "tool_call_id": None,
                "name": None}
    return {"role": m.get("role"), "content": _text(m.get("content")),
            "tool_calls": _text(m.get("tool_calls")) if m.get("tool_calls") else None,
            "tool_call_id": m.get("tool_call_id"), "name": m.get("name")}


def seen_messages(turns: Sequence[dict[str, Any]], placement: Placement | None,
                  keep_history: bool) -> list[Any]:
    """The conversation as the model saw it at the last turn, its reply appended: the client's
    messages rebuilt from each turn's new ones, with the turns' logged disclosure texts placed
    again by the proxy's own rule (core.disclosure) when `placement` is given."""
    conv: list[Any] = []
    earlier: list[tuple[int, str]] = []
    placed: list[Any] = []
    for t in turns:
        offset = t.get("messages_offset") or 0
        new = t.get("request_messages") or []
        conv = [*conv[:offset], *new] if offset <= len(conv) else list(new)
        text = (t.get("disclosure") or {}).get("text")
        if placement is None or not isinstance(text, str):
            placed = conv
            continue
        placed = disclosure.apply(conv, placement, text, earlier if keep_history else ())
        index = disclosure.placement_index(placement, len(conv))
        if index is not None:
            earlier.append((index, text))
    last = turns[-1].get("response") if turns else None
    return [*placed, last] if isinstance(last, dict) else list(placed)


def episode_rows(episodes: list[dict[str, Any]], turns: dict[str, list[dict[str, Any]]], *,
                 on_exhausted: OnExhausted, scale_by_std: bool, placement: Placement | None,
                 keep_history: bool) -> list[dict[str, Any]]:
    rows = []
    for ep in episodes:
        kept = last_attempts(turns.get(ep["episode_id"], []))
        row = {k: ep.get(k) for k in COLUMNS if k in ep}
        row["reported_reward"] = ep.get("reward")
        row["reward"] = final_reward(ep.get("reward"), ep.get("outcome"), ep.get("end_reason"),
                                     on_exhausted)
        row["messages"] = [message_row(m) for m in seen_messages(kept, placement,
                                                                  keep_history)]
        captured = any(t.get("prompt_token_ids") is not None for t in kept)
        seq = sequence(kept) if captured else None
        row["turn_prompt_token_ids"] = [t.get("prompt_token_ids") for t in kept] if (
            captured) else None
        row["turn_completion_token_ids"] = [t.get("completion_token_ids") for t in kept] if (
            captured) else None
        row["turn_logprobs"] = [t.get("logprobs") for t in kept] if captured else None
        row["append_only"] = seq is not None if captured else None
        row["token_ids"] = seq.token_ids if seq else None
        row["loss_mask"] = seq.loss_mask if seq else None
        row["logprobs"] = seq.logprobs if seq else None
        rows.append(row)
    by_group: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row.get("task_id") is not None and row.get("group") is not None:
            by_group[(row["task_id"], row["group"])].append(row)
    for members in by_group.values():
        advs = advantages([r["reward"] for r in members], scale_by_std=scale_by_std)
        for r, a in zip(members, advs, strict=True):
            r["advantage"] = a
    for row in rows:
        row.setdefault("advantage", None)
    return rows


def _fetch(con: Any, sql: str) -> list[dict[str, Any]]:
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def read_logs(con: Any, paths: Sequence[str]) -> tuple[list[dict[str, Any]],
                                                      dict[str, list[dict[str, Any]]]]:
    """Episodes (validated, one per id) and their answered turns, via the analysis readers."""
    from budgetproxy.analysis import load
    from budgetproxy.analysis.progress import Progress

    inputs = load.discover(paths)
    load.load_episodes(con, inputs, Progress(inputs.total_bytes))
    load.create_turns_view(con, inputs, "export_turns",
                           {**load.TURN_COLUMNS, **TOKEN_TURN_COLUMNS})
    # (timestamps as RFC 3339 text with their zone: what JSONL holds and Parquet reads back)
    stamp = "strftime({0} AT TIME ZONE 'UTC', '%Y-%m-%dT%H:%M:%S.%gZ') AS {0}"
    derived = {
        "tags": "CAST(tags AS VARCHAR) AS tags",
        "metadata": "CAST(metadata AS VARCHAR) AS metadata",
        "started_at": stamp.format("started_at"), "ended_at": stamp.format("ended_at"),
        "duration_s": "round(epoch(ended_at) - epoch(started_at), 3) AS duration_s",
    }
    names = ", ".join(derived.get(n, f'"{n}"') for n in RECORD_COLUMNS)
    episodes = _fetch(con, f"""
        SELECT {names}, reward
        FROM episodes ORDER BY task_id NULLS LAST, "group" NULLS LAST, started_at, episode_id""")
    rows = _fetch(con, """
        SELECT episode_id, turn, attempt, CAST(request_messages AS VARCHAR) AS request_messages,
               messages_offset, CAST(response AS VARCHAR) AS response,
               CAST(disclosure AS VARCHAR) AS disclosure, prompt_token_ids,
               completion_token_ids, logprobs
        FROM export_turns WHERE status = 'ok' ORDER BY episode_id, turn, attempt, ts""")
    turns: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        for k in ("request_messages", "response", "disclosure"):
            r[k] = json.loads(r[k]) if r[k] is not None else None
        turns[r["episode_id"]].append(r)
    return episodes, turns


def write(con: Any, rows: list[dict[str, Any]], out: Path, fmt: str) -> Path:
    """OUT/episodes.parquet (typed columns, zstd) or OUT/episodes.jsonl."""
    from budgetproxy.analysis.db import sql_str
    from budgetproxy.analysis.load import MAX_LINE_BYTES

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", dir=out, delete=False,
                                     encoding="utf-8") as tmp:
        for row in rows:
            tmp.write(json.dumps({k: row.get(k) for k in COLUMNS}, ensure_ascii=False) + "\n")
    staged = Path(tmp.name)
    if fmt == "jsonl":
        target = out / "episodes.jsonl"
        staged.replace(target)
        return target
    target = out / "episodes.parquet"
    spec = ", ".join(f"{sql_str(n)}: {sql_str(t)}" for n, t in COLUMNS.items())
    names = ", ".join(f'"{n}"' for n in COLUMNS)
    try:
        con.execute(
            f"COPY (SELECT {names} FROM read_json({sql_str(str(staged))}, "
            f"format = 'newline_delimited', columns = {{{spec}}}, "
            f"maximum_object_size = {MAX_LINE_BYTES})) TO {sql_str(str(target))} "
            f"(FORMAT parquet, COMPRESSION zstd)")
    finally:
        staged.unlink(missing_ok=True)
    return target
