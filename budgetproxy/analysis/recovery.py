"""Recovery view: after a tool error, does the agent still succeed, and does it change course?

An error is a tool-result message (`role: tool` in a turn's request_messages) whose text
matches the pattern. The action that produced it is the previous turn's tool call with the
message's tool_call_id (without an id: all of the previous turn's calls); the next action is
the response of the turn that carried the error back to the model. The action changed unless
that response repeats the failed call (same tool name and arguments).
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
COLUMNS = {
    "episode_id": "VARCHAR", "turn": "BIGINT", "attempt": "BIGINT", "status": "VARCHAR",
    "request_messages": "STRUCT(role VARCHAR, content VARCHAR, tool_call_id VARCHAR)[]",
    "response": "STRUCT(content VARCHAR, tool_calls STRUCT(id VARCHAR, "
                '"function" STRUCT(name VARCHAR, arguments VARCHAR))[])',
}  # fmt: skip

# Pass 1, over every turn: per episode, the (turn, tool_call_ids) of its tool errors.
SCAN_SQL = """
CREATE OR REPLACE TEMP TABLE recovery_scan AS
WITH per_turn AS (
    SELECT episode_id, turn, list_transform(list_filter(request_messages, lambda m:
            m.role = 'tool' AND regexp_matches(
                CASE WHEN starts_with(m.content, '[{{') AND json_valid(m.content)
                     THEN array_to_string(json_extract_string(m.content, '$[*].text'), chr(10))
                     ELSE coalesce(m.content, '') END, {pattern})),
        lambda m: m.tool_call_id) AS error_ids
    FROM recovery_turns
)
SELECT episode_id,
    list({{'turn': turn, 'ids': error_ids}}) FILTER (WHERE len(error_ids) > 0) AS errors
FROM per_turn GROUP BY episode_id
"""

ERRORS_SQL = """
CREATE OR REPLACE TEMP TABLE recovery_errors AS
SELECT DISTINCT episode_id, e.turn, unnest(e.ids) AS call_id
FROM (SELECT episode_id, unnest(errors) AS e FROM recovery_scan WHERE errors IS NOT NULL)
"""

# Pass 2, over the turns around errors only (the turn before: the failed call; the turn of
# the error: the next action): each turn's tool calls as signatures name(arguments), with
# arguments re-serialised so that whitespace does not count as a change.
CALLS_SQL = """
CREATE OR REPLACE TEMP TABLE recovery_calls AS
WITH needed AS (
    SELECT DISTINCT episode_id, turn FROM (
        SELECT episode_id, turn FROM recovery_errors
        UNION ALL SELECT episode_id, turn - 1 FROM recovery_errors)
)
SELECT t.episode_id, t.turn,
    list_transform(coalesce(t.response.tool_calls, []), lambda c: {
        'id': c.id,
        'sig': coalesce(c."function".name, '') || '(' || CASE
            WHEN json_valid(c."function".arguments)
            THEN CAST(json(c."function".arguments) AS VARCHAR)
            ELSE coalesce(c."function".arguments, '') END || ')'}) AS calls
FROM recovery_turns t SEMI JOIN needed n ON n.episode_id = t.episode_id AND n.turn = t.turn
WHERE coalesce(t.status, 'ok') = 'ok' AND t.response IS NOT NULL
QUALIFY row_number() OVER (
    PARTITION BY t.episode_id, t.turn ORDER BY t.attempt DESC NULLS LAST) = 1
"""

JUDGED_SQL = """
CREATE OR REPLACE TEMP TABLE recovery_judged AS
WITH paired AS (
    SELECT e.episode_id, e.turn, prev.calls AS prev_calls, nxt.calls AS next_calls,
        list_filter(prev.calls, lambda c: c.id = e.call_id)[1].sig AS failed
    FROM recovery_errors e
    LEFT JOIN recovery_calls prev ON prev.episode_id = e.episode_id AND prev.turn = e.turn - 1
    LEFT JOIN recovery_calls nxt ON nxt.episode_id = e.episode_id AND nxt.turn = e.turn
)
SELECT episode_id, turn,
    next_calls IS NOT NULL AND (failed IS NOT NULL OR prev_calls IS NOT NULL) AS judged,
    CASE WHEN failed IS NOT NULL
         THEN list_contains(list_transform(next_calls, lambda c: c.sig), failed)
         ELSE list_sort(list_transform(next_calls, lambda c: c.sig))
              = list_sort(list_transform(prev_calls, lambda c: c.sig)) END AS repeated
FROM paired
"""

SUMMARY_SQL = """
WITH per_episode AS (
    SELECT episode_id, count(*) AS errors, count(*) FILTER (WHERE judged) AS judged,
           count(*) FILTER (WHERE judged AND NOT repeated) AS changed
    FROM recovery_judged GROUP BY episode_id
)
SELECT e.disclosure, e.model, count(*) AS episodes,
    count(p.episode_id) AS with_error,
    count(p.episode_id) FILTER (WHERE e.success) AS with_error_success,
    count(*) FILTER (WHERE p.episode_id IS NULL AND e.success) AS without_error_success,
    coalesce(sum(p.errors), 0), coalesce(sum(p.judged), 0), coalesce(sum(p.changed), 0)
FROM episodes e
JOIN recovery_scan s USING (episode_id)
LEFT JOIN per_episode p USING (episode_id)
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
    """Needs the `episodes` table. The pattern is an RE2 regex."""
    create_turns_view(con, inputs, "recovery_turns", COLUMNS)
    progress.execute(con, SCAN_SQL.format(pattern=sql_str(pattern)), "scanning tool results")
    con.execute(ERRORS_SQL)
    progress.execute(con, CALLS_SQL, "reading responses around errors")
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
