"""Recovery view: after a tool error, does the agent still succeed, and does it change course?

An error is a tool-result message (`role: tool` in a turn's request_messages) whose text
matches the pattern. The failed action is the assistant tool call with that message's
tool_call_id, which the agent echoes in the same request; the next action is the response of
that turn. The action changed unless that response repeats the failed call (same tool name and
arguments). Errors whose call cannot be found, or whose turn got no answer, are counted but
not judged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from budgetproxy.analysis.db import sql_str
from budgetproxy.analysis.load import Inputs, create_turns_view
from budgetproxy.analysis.progress import Progress

# The turn fields the view needs, typed so each line is parsed once. A message content that
# is a list of parts arrives as its JSON text.
CALL = 'STRUCT(id VARCHAR, "function" STRUCT(name VARCHAR, arguments VARCHAR))'
COLUMNS = {
    "episode_id": "VARCHAR", "turn": "BIGINT", "attempt": "BIGINT", "status": "VARCHAR",
    "messages_offset": "BIGINT",
    "request_messages": "STRUCT(role VARCHAR, content VARCHAR, tool_call_id VARCHAR, "
                        f"tool_calls {CALL}[])[]",
    "response": f"STRUCT(content VARCHAR, tool_calls {CALL}[])",
}  # fmt: skip

# A tool call as name(arguments), arguments re-serialised so whitespace is not a change.
SIG = """coalesce({c}."function".name, '') || '(' || CASE
    WHEN json_valid({c}."function".arguments) THEN CAST(json({c}."function".arguments) AS VARCHAR)
    ELSE coalesce({c}."function".arguments, '') END || ')'"""

# One pass over the turns. A turn's request_messages hold what is new since the turn before:
# the assistant message echoing the previous response (the failed call) and the tool results.
# Per turn with an error: the failed call of each error (found by tool_call_id among the
# echoed calls) and the calls of this turn's response (the next action). A later turn whose
# conversation was rewritten logs it whole again (messages_offset 0), repeating tool results
# of earlier turns: there, an error whose id an earlier turn already had is not a new one.
# (Elsewhere ids may repeat: many models number their calls per response, call_0, call_1.)
SCAN_SQL = """
CREATE OR REPLACE TEMP TABLE recovery_errors AS
WITH per_turn AS (
    SELECT episode_id, turn, attempt, status, request_messages AS msgs, response,
        coalesce(messages_offset, 0) = 0
            AND turn > min(turn) OVER (PARTITION BY episode_id) AS relogged,
        list_transform(list_filter(request_messages, lambda m:
            m.role = 'tool' AND regexp_matches(
                CASE WHEN starts_with(m.content, '[{{') AND json_valid(m.content)
                     THEN array_to_string(json_extract_string(m.content, '$[*].text'), chr(10))
                     ELSE coalesce(m.content, '') END, {pattern})),
        lambda m: m.tool_call_id) AS error_ids
    FROM recovery_turns
), with_earlier AS (
    SELECT *, coalesce(flatten(list(error_ids) OVER (PARTITION BY episode_id ORDER BY turn
        RANGE BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)), []) AS earlier_ids
    FROM per_turn
), fresh AS (
    SELECT * EXCLUDE (earlier_ids) REPLACE (CASE WHEN relogged THEN list_filter(error_ids,
        lambda i: i IS NULL OR NOT list_contains(earlier_ids, i)) ELSE error_ids END AS error_ids)
    FROM with_earlier
)
SELECT episode_id, turn, coalesce(attempt, 1) AS attempt,
    coalesce(status, 'ok') = 'ok' AND response IS NOT NULL AS answered,
    list_transform(error_ids, lambda i: list_transform(list_filter(
        flatten(list_transform(msgs, lambda m: coalesce(m.tool_calls, []))),
        lambda c: c.id = i), lambda c: {sig_c})[1]) AS failed,
    list_transform(coalesce(response.tool_calls, []), lambda c: {sig_c}) AS next
FROM fresh WHERE len(error_ids) > 0
"""

# Retries repeat a turn's request: judge each turn once, by its last answered attempt.
JUDGED_SQL = """
CREATE OR REPLACE TEMP TABLE recovery_judged AS
WITH turns AS (
    SELECT episode_id, turn,
        max_by(struct_pack(answered, failed, next), answered::INTEGER * 1000000 + attempt) AS x
    FROM recovery_errors GROUP BY episode_id, turn
), errors AS (
    SELECT episode_id, x.answered AS answered, x.next AS next, unnest(x.failed) AS failed
    FROM turns
)
SELECT episode_id, count(*) AS errors,
    count(*) FILTER (WHERE answered AND failed IS NOT NULL) AS judged,
    count(*) FILTER (WHERE answered AND failed IS NOT NULL
                     AND NOT list_contains(next, failed)) AS changed
FROM errors GROUP BY episode_id
"""

SUMMARY_SQL = """
SELECT e.disclosure, e.model, count(*) AS episodes,
    count(p.episode_id) AS with_error,
    count(p.episode_id) FILTER (WHERE e.success) AS with_error_success,
    count(*) FILTER (WHERE p.episode_id IS NULL AND e.success) AS without_error_success,
    coalesce(sum(p.errors), 0), coalesce(sum(p.judged), 0), coalesce(sum(p.changed), 0)
FROM episodes e
JOIN turn_episodes USING (episode_id)
LEFT JOIN recovery_judged p USING (episode_id)
WHERE e.end_reason <> 'abandoned'
GROUP BY ALL ORDER BY e.disclosure, e.model NULLS LAST
"""


@dataclass(frozen=True)
class RecoveryRow:
    """Recovery of one arm and model, over finished episodes that have turn records."""

    disclosure: str
    model: str | None
    episodes: int
    episodes_with_error: int
    success_after_error: float | None  # share of episodes with an error that succeeded
    success_without_error: float | None
    errors: int
    errors_with_next_action: int
    changed_next_action: float | None  # share of those where the next action differs

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def compute_recovery(
    con: Any, inputs: Inputs, pattern: str, progress: Progress
) -> list[RecoveryRow]:
    """Needs the tables `episodes` and `turn_episodes`. The pattern is an RE2 regex."""
    create_turns_view(con, inputs, "recovery_turns", COLUMNS)
    sql = SCAN_SQL.format(pattern=sql_str(pattern), sig_c=SIG.format(c="c"))
    progress.execute(con, sql, "scanning tool results")
    con.execute(JUDGED_SQL)
    rows = con.execute(SUMMARY_SQL).fetchall()
    out = []
    for arm, model, eps, with_err, err_ok, no_err_ok, errors, judged, changed in rows:
        out.append(
            RecoveryRow(
                disclosure=arm,
                model=model,
                episodes=eps,
                episodes_with_error=with_err,
                success_after_error=_share(err_ok, with_err),
                success_without_error=_share(no_err_ok, eps - with_err),
                errors=int(errors),
                errors_with_next_action=int(judged),
                changed_next_action=_share(int(changed), int(judged)),
            )
        )
    return out


def format_recovery(rows: Sequence[RecoveryRow], pattern: str) -> str:
    """A terminal table of the recovery view."""
    if not rows:
        return f"Recovery after tool errors (/{pattern}/): no finished episodes with turns\n"

    def pct(x: float | None) -> str:
        return "—" if x is None else f"{100 * x:.1f}%"

    header = [
        "arm",
        "model",
        "episodes",
        "with error",
        "succeeded after error",
        "succeeded, no error",
        "errors",
        "changed next action",
    ]
    body = [
        [
            r.disclosure,
            r.model or "-",
            f"{r.episodes:,}",
            f"{r.episodes_with_error:,}",
            pct(r.success_after_error),
            pct(r.success_without_error),
            f"{r.errors:,}",
            pct(r.changed_next_action),
        ]
        for r in rows
    ]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    lines = [
        "  ".join(
            v.ljust(w) if i < 2 else v.rjust(w)
            for i, (v, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in [header, *body]
    ]
    note = (
        "changed next action: share of errors whose next response did not repeat the failed "
        "call (same tool, same arguments)."
    )
    return f"Recovery after tool errors (/{pattern}/)\n\n" + "\n".join(lines) + f"\n\n{note}\n"
