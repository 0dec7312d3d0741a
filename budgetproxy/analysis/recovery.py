"""Recovery view: after a tool error, does the agent still succeed, and does it change course?

An error is a tool-result message (`role: tool` in a turn's request_messages) whose text
matches the pattern. The action that produced it is the assistant tool call with the message's
tool_call_id (else the previous turn's calls); the next action is the response of the turn
that carried the error back to the model. The action changed unless that response repeats the
failed call (same tool name and arguments).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from budgetproxy.analysis.load import sql_str
from budgetproxy.analysis.progress import Progress

# One pass over the turns: per episode, the turns seen and the (turn, tool_call_id) of errors.
SCAN_SQL = """
CREATE OR REPLACE TEMP TABLE recovery_scan AS
WITH per_turn AS (
    SELECT episode_id, turn,
        CASE WHEN contains(CAST(request_messages AS VARCHAR), '"tool"') THEN
            list_transform(
                list_filter(json_extract(request_messages, '$[*]'), lambda m:
                    m ->> 'role' = 'tool' AND regexp_matches(
                        CASE WHEN json_type(m -> 'content') = 'ARRAY'
                             THEN array_to_string(
                                    json_extract_string(m, '$.content[*].text'), chr(10))
                             ELSE coalesce(m ->> 'content', '') END, {pattern})),
                lambda m: m ->> 'tool_call_id')
        END AS error_ids
    FROM turns
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

# The responses of episodes with an error (last ok attempt per turn), their tool calls and
# each turn's whole action, then each error judged against the next response.
JUDGED_SQL = """
CREATE OR REPLACE TEMP TABLE recovery_judged AS
WITH responses AS (
    SELECT episode_id, turn, response FROM turns
    WHERE episode_id IN (SELECT episode_id FROM recovery_errors)
      AND coalesce(status, 'ok') = 'ok' AND response IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY episode_id, turn ORDER BY attempt DESC NULLS LAST) = 1
), calls AS (
    SELECT episode_id, turn, c ->> 'id' AS call_id,
        coalesce(c -> 'function' ->> 'name', c ->> 'name', '') || '(' ||
        CASE WHEN json_valid(a) THEN CAST(json(a) AS VARCHAR) ELSE coalesce(a, '') END
        || ')' AS sig
    FROM (SELECT episode_id, turn, c,
                 coalesce(c -> 'function' ->> 'arguments', c ->> 'arguments') AS a
          FROM (SELECT episode_id, turn,
                       unnest(json_extract(response, '$.tool_calls[*]')) AS c FROM responses))
), actions AS (
    SELECT r.episode_id, r.turn, coalesce(string_agg(c.sig, chr(31) ORDER BY c.sig), '') AS act
    FROM responses r LEFT JOIN calls c USING (episode_id, turn) GROUP BY ALL
), produced AS (
    SELECT e.episode_id, e.turn, e.call_id, arg_max(c.sig, c.turn) AS sig
    FROM recovery_errors e JOIN calls c
      ON c.episode_id = e.episode_id AND c.call_id = e.call_id AND c.turn < e.turn
    GROUP BY ALL
), repeats AS (SELECT DISTINCT episode_id, turn, sig FROM calls)
SELECT e.episode_id, e.turn,
    nxt.act IS NOT NULL AND (p.sig IS NOT NULL OR prev.act IS NOT NULL) AS judged,
    CASE WHEN p.sig IS NOT NULL THEN rep.sig IS NOT NULL ELSE nxt.act = prev.act END AS repeated
FROM recovery_errors e
LEFT JOIN produced p
  ON p.episode_id = e.episode_id AND p.turn = e.turn AND p.call_id = e.call_id
LEFT JOIN actions nxt ON nxt.episode_id = e.episode_id AND nxt.turn = e.turn
LEFT JOIN actions prev ON prev.episode_id = e.episode_id AND prev.turn = e.turn - 1
LEFT JOIN repeats rep ON rep.episode_id = e.episode_id AND rep.turn = e.turn AND rep.sig = p.sig
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


def compute_recovery(con: Any, pattern: str, progress: Progress) -> list[RecoveryRow]:
    """Needs the `episodes` table and the `turns` view. The pattern is an RE2 regex."""
    progress.execute(con, SCAN_SQL.format(pattern=sql_str(pattern)), "scanning tool results")
    con.execute(ERRORS_SQL)
    progress.execute(con, JUDGED_SQL, "reading responses after errors")
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
