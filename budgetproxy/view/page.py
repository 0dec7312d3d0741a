"""The episode view's pages, built from records as values: no files, no sockets.

Every string that comes from a log (ids, messages, replies, tool arguments, tags) is untrusted
and reaches the page only through `html.escape`; file names made from ids are a cleaned prefix
and a hash, never the id itself. Pages carry a Content-Security-Policy that allows no script,
so even a bug in the escaping could not run code.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any

from budgetproxy.view.logs import EpisodeLog

INDEX = "index.html"
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; color: #222; margin: 24px auto; max-width: 1100px;
       padding: 0 20px; }
h1 { font-size: 20px; overflow-wrap: anywhere; } h2 { font-size: 16px; margin-top: 28px; }
nav { color: #555; } a { color: #0b5cad; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; margin: 6px 0; }
th, td { padding: 3px 10px; border-bottom: 1px solid #eee; text-align: left; vertical-align: top; }
td.num, th.num { text-align: right; }
.turn { border: 1px solid #ddd; border-radius: 6px; margin: 16px 0; padding: 6px 14px 10px; }
.turn h3 { font-size: 15px; margin: 6px 0; }
.badge { display: inline-block; font-size: 12px; padding: 0 7px; border-radius: 9px;
         background: #eee; margin-left: 6px; font-weight: normal; }
.badge.charged { background: #dcebf7; } .badge.refused { background: #f7dcdc; }
.badge.refunded, .badge.free { background: #e7f3df; } .badge.success { background: #d8f0d2; }
.badge.exhausted, .badge.failure { background: #f7e3cf; }
.meta { color: #555; font-size: 13px; }
.msg { border-left: 3px solid #ccc; margin: 6px 0; padding: 2px 10px; }
.msg.user { border-color: #0072B2; } .msg.assistant { border-color: #009E73; }
.msg.tool { border-color: #E69F00; } .msg.system { border-color: #999; }
.role { font-size: 12px; color: #555; text-transform: uppercase; letter-spacing: .04em; }
.role span { text-transform: none; letter-spacing: 0; }
.budget-text { background: #fff8e1; border: 1px solid #f0d98c; padding: 4px 10px; }
pre { background: #f6f6f6; padding: 6px 8px; white-space: pre-wrap; overflow-wrap: anywhere;
      margin: 4px 0; }
.muted { color: #666; }
"""

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def page_name(kind: str, ident: str) -> str:
    """The file name of the page of a task or an episode: a cleaned prefix of its id (for a
    reader) and a hash of the whole id (so ids that clean alike stay apart)."""
    digest = hashlib.sha256(ident.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    slug = _UNSAFE.sub("_", ident)[:40].strip("._") or "_"
    return f"{kind}-{slug}-{digest}.html"


def task_page_name(task_id: str | None) -> str:
    """The page listing a task's episodes; episodes without a task share one page."""
    return page_name("task", task_id) if task_id is not None else "task-none.html"


def episode_page_name(episode_id: str) -> str:
    return page_name("episode", episode_id)


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _page(title: str, body: str) -> str:
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        "<meta name=viewport content='width=device-width, initial-scale=1'>"
        f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>{body}</body></html>\n"
    )


def _mapping(value: Any) -> Mapping[str, Any]:
    """A log field that should be an object, or an empty one when it is not."""
    return value if isinstance(value, Mapping) else {}


def _json(value: Any) -> str:
    return _e(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def _number(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "—" if value is None else str(value).lower()
    if isinstance(value, float):
        return f"{value:,.4f}".rstrip("0").rstrip(".") if value % 1 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return _e(value)


# --- one turn -------------------------------------------------------------------------------


def turn_state(turn: Mapping[str, Any]) -> tuple[str, str]:
    """(CSS class, words) for how a call settled: charged, refused, refunded or free."""
    status, charged = turn.get("status"), turn.get("charged")
    if turn.get("type") == "compaction":
        return "free", "compaction, not charged"
    if status == "rejected":
        return "refused", "refused (not forwarded)"
    if charged:
        return "charged", "charged"
    if status == "upstream_error":
        return "refunded", "upstream error, refunded"
    if status == "client_closed":
        return "refunded", "client closed, refunded"
    if int(turn.get("attempt") or 1) > 1:
        return "free", "free retry"
    return "free", "not charged"


def _content(content: Any) -> str:
    """A message's content: text as text, any other block as its JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return f"<pre>{_e(content)}</pre>"
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, Mapping) and isinstance(block.get("text"), str):
                parts.append(f"<pre>{_e(block['text'])}</pre>")
            else:
                parts.append(f"<pre>{_json(block)}</pre>")
        return "".join(parts)
    return f"<pre>{_json(content)}</pre>"


def _tool_calls(calls: Any) -> str:
    """Tool calls as `name(arguments)`, in chat-completions or Responses/Messages shape."""
    if not isinstance(calls, list) or not calls:
        return ""
    items = []
    for call in calls:
        if not isinstance(call, Mapping):
            items.append(f"<li><pre>{_json(call)}</pre></li>")
            continue
        fn = _mapping(call.get("function")) or call
        name = fn.get("name", "?")
        args = fn.get("arguments", fn.get("input", ""))
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False, default=str)
        items.append(f"<li><code>{_e(name)}({_e(args)})</code></li>")
    return f"<ul class=calls>{''.join(items)}</ul>"


def _message(msg: Any) -> str:
    if not isinstance(msg, Mapping):
        return f"<div class=msg><pre>{_json(msg)}</pre></div>"
    role = str(msg.get("role") or msg.get("type") or "message")
    extra = ""
    if msg.get("tool_call_id") is not None:
        extra = f" <span class=muted>for {_e(msg['tool_call_id'])}</span>"
    body = _content(msg.get("content")) + _tool_calls(msg.get("tool_calls"))
    if not body:
        rest = {k: v for k, v in msg.items() if k != "role"}
        body = f"<pre>{_json(rest)}</pre>" if rest else "<span class=muted>(empty)</span>"
    css = re.sub(r"[^a-z]", "", role.lower())[:20]
    return f"<div class='msg {css}'><div class=role>{_e(role)}{extra}</div>{body}</div>"


def _spend_line(turn: Mapping[str, Any], budgets: Mapping[str, Any]) -> str:
    cum = _mapping(turn.get("cumulative"))
    parts = []
    for axis, budget_key in (("turns", "budget"), ("tokens", "token_budget"),
                             ("cost", "cost_budget"), ("seconds", "time_budget_s")):
        used, cap = cum.get(axis), budgets.get(budget_key)
        if axis == "turns" and cap is None:
            cap = turn.get("budget")
        if used is None and cap is None:
            continue
        parts.append(f"{axis} {_number(used)} of {_number(cap) if cap is not None else 'no cap'}")
    if turn.get("remaining") is not None:
        parts.append(f"{_number(turn['remaining'])} turns left")
    return "; ".join(parts)


def _usage(usage: Any) -> str:
    if not isinstance(usage, Mapping):
        return ""
    keys = ("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens")
    shown = [f"{k.replace('_', ' ')} {_number(usage[k])}" for k in keys if k in usage]
    return ", ".join(shown)


def turn_html(turn: Mapping[str, Any], budgets: Mapping[str, Any], arm: str | None) -> str:
    """One call of an episode: what was new in its request, the budget text, the reply."""
    n, attempt = turn.get("turn", "?"), int(turn.get("attempt") or 1)
    css, words = turn_state(turn)
    anchor = f"turn-{_e(n)}-{attempt}"
    head = f"Turn {_e(n)}" + (f" <span class=badge>attempt {attempt}</span>" if attempt > 1
                                else "")  # fmt: skip
    head += f" <span class='badge {css}'>{_e(words)}</span>"
    meta = [f"HTTP {_e(turn.get('http_status', '?'))}", _e(turn.get("route") or ""),
            _e(turn.get("model") or "")]  # fmt: skip
    if turn.get("stream"):
        meta.append("streamed")
    if turn.get("latency_s") is not None:
        meta.append(f"{_number(turn['latency_s'])} s")
    if turn.get("ts"):
        meta.append(_e(turn["ts"]))
    parts = [f"<section class=turn id='{anchor}'><h3>{head}</h3>",
             f"<div class=meta>{' · '.join(m for m in meta if m)}</div>",
             f"<div class=meta>spend after it: {_spend_line(turn, budgets)}</div>"]  # fmt: skip
    messages = turn.get("request_messages")
    offset = turn.get("messages_offset", 0)
    for key in ("instructions", "system"):
        if turn.get(key):
            parts.append(f"<div class='msg system'><div class=role>{key}</div>"
                         f"{_content(turn[key])}</div>")  # fmt: skip
    if isinstance(messages, list):
        where = "the whole conversation" if offset == 0 else f"from message {_e(offset)} on"
        parts.append(f"<h4>New messages ({len(messages)}, {where})</h4>")
        parts += [_message(m) for m in messages]
    disclosure = _mapping(turn.get("disclosure"))
    text = disclosure.get("text")
    if text:
        parts.append(f"<h4>Budget text the model saw</h4><div class=budget-text>{_content(text)}"
                     "</div>")  # fmt: skip
    else:
        why = ("hidden arm: the model was not told its budget" if (disclosure.get("arm") or arm)
               == "hidden" else "none placed this turn")  # fmt: skip
        parts.append(f"<h4>Budget text the model saw</h4><p class=muted>{why}</p>")
    response = turn.get("response")
    parts.append("<h4>Reply</h4>")
    if isinstance(response, Mapping):
        body = _content(response.get("content")) + _tool_calls(response.get("tool_calls"))
        parts.append(body or "<p class=muted>(empty reply)</p>")
    elif turn.get("status") == "rejected":
        parts.append("<p class=muted>none: the proxy refused the call without forwarding it</p>")
    else:
        parts.append("<p class=muted>none</p>")
    tail = [f"finish reason {_e(turn['finish_reason'])}"] if turn.get("finish_reason") else []
    if usage := _usage(turn.get("usage")):
        tail.append(usage)
    if tail:
        parts.append(f"<div class=meta>{' · '.join(tail)}</div>")
    parts.append("</section>")
    return "".join(parts)


# --- one episode ----------------------------------------------------------------------------


def _sort_key(turn: Mapping[str, Any]) -> tuple[int, int, str]:
    n, a = turn.get("turn"), turn.get("attempt")
    return (n if isinstance(n, int) else 0, a if isinstance(a, int) else 1,
            str(turn.get("ts") or ""))  # fmt: skip


def spend_table(log: EpisodeLog) -> str:
    """Spend on every axis against its budget, from the episode record (or the last turn's
    running totals while the episode has no record)."""
    rec = log.record or {}
    last = max(log.turns, key=_sort_key) if log.turns else {}
    cum = _mapping(last.get("cumulative"))
    rows = []
    for axis, used_key, cap_key, cum_key in (
        ("turns", "turns_used", "budget", "turns"),
        ("tokens", "tokens_used", "token_budget", "tokens"),
        ("cost (USD)", "cost_used", "cost_budget", "cost"),
        ("time (s)", "time_used_s", "time_budget_s", "seconds"),
    ):
        used = rec.get(used_key, cum.get(cum_key))
        cap = rec.get(cap_key, last.get("budget") if cap_key == "budget" else None)
        if cap is None and not used:
            continue
        share = ""
        if isinstance(cap, int | float) and cap and isinstance(used, int | float):
            share = f"{100 * used / cap:.0f}%"
        ended = " ← ran out" if rec.get("exhausted_by") == axis.split(" ")[0].replace(
            "time", "time") else ""
        rows.append(f"<tr><td>{_e(axis)}{ended}</td><td class=num>{_number(used)}</td>"
                    f"<td class=num>{_number(cap) if cap is not None else 'no cap'}</td>"
                    f"<td class=num>{share}</td></tr>")  # fmt: skip
    return ("<table><tr><th>axis</th><th class=num>spent</th><th class=num>budget</th>"
            f"<th class=num>share</th></tr>{''.join(rows)}</table>")


def _calls_summary(turns: Sequence[Mapping[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for t in turns:
        words = turn_state(t)[1]
        counts[words] = counts.get(words, 0) + 1
    retries = sum(1 for t in turns if int(t.get("attempt") or 1) > 1)
    text = ", ".join(f"{n} {w}" for w, n in counts.items())
    return f"{len(turns)} calls logged: {text}; {retries} of them retries of a turn"


def _outcome_badge(rec: Mapping[str, Any]) -> str:
    reason = rec.get("end_reason")
    if reason is None:
        return "<span class=badge>no episode record: still running, or its file not given</span>"
    css = reason if reason in ("success", "failure", "exhausted") else ""
    return f"<span class='badge {_e(css)}'>{_e(reason)}</span>"


def episode_page(log: EpisodeLog) -> str:
    """The page of one episode: what it was, how it ended, what it spent, every call."""
    rec = log.record or {}
    turns = sorted(log.turns, key=_sort_key)
    facts: list[tuple[str, Any]] = [
        ("task", log.task_id), ("group", rec.get("group")), ("model", rec.get("model")),
        ("disclosure", rec.get("disclosure")), ("budget", rec.get("budget")),
        ("max_turns", rec.get("max_turns")), ("tier", rec.get("tier")),
        ("announced budget", rec.get("announced_budget")), ("outcome", rec.get("outcome")),
        ("end reason", rec.get("end_reason")), ("exhausted by", rec.get("exhausted_by")),
        ("success turn", rec.get("success_turn")), ("reward", rec.get("reward")),
        ("started", rec.get("started_at")), ("ended", rec.get("ended_at")),
    ]  # fmt: skip
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts
                   if v is not None)  # fmt: skip
    for key in ("tags", "metadata"):
        if rec.get(key):
            rows += f"<tr><th>{key}</th><td><code>{_json(rec[key])}</code></td></tr>"
    budgets = {k: rec.get(k) for k in ("budget", "token_budget", "cost_budget", "time_budget_s")}
    arm = rec.get("disclosure")
    task_href = task_page_name(log.task_id)
    body = [
        f"<nav><a href='{INDEX}'>all tasks</a> · <a href='{task_href}'>task "
        f"{_e(log.task_id if log.task_id is not None else '(none)')}</a></nav>",
        f"<h1>Episode {_e(log.episode_id)} {_outcome_badge(rec)}</h1>",
        f"<table class=facts>{rows}</table>",
        "<h2>Spend against the budget</h2>", spend_table(log),
        f"<h2>Turns</h2><p class=meta>{_e(_calls_summary(turns))}. Each call shows the "
        "messages new since the previous one, the budget text the proxy placed, and the "
        "reply.</p>",
        *(turn_html(t, budgets, arm if isinstance(arm, str) else None) for t in turns),
    ]
    if not turns:
        body.append("<p class=muted>No turn records for this episode in the logs given.</p>")
    return _page(f"Episode {log.episode_id}", "".join(body))


# --- lists ----------------------------------------------------------------------------------


def _episode_row(log: EpisodeLog) -> str:
    rec = log.record or {}
    tags = _mapping(rec.get("tags"))
    tag_text = ", ".join(f"{k}={v}" for k, v in tags.items())
    cells = [rec.get("model"), tag_text, rec.get("disclosure"), rec.get("budget"),
             rec.get("tier"), rec.get("turns_used"), rec.get("end_reason") or "(running)",
             rec.get("reward")]  # fmt: skip
    tds = "".join(f"<td>{_e('' if v is None else v)}</td>" for v in cells)
    return (f"<tr><td><a href='{episode_page_name(log.episode_id)}'>{_e(log.episode_id)}</a>"
            f"</td>{tds}<td class=num>{len(log.turns)}</td></tr>")


def task_page(task_id: str | None, logs: Sequence[EpisodeLog]) -> str:
    """A task's episodes, one row each, linking to their pages."""
    head = "".join(f"<th>{h}</th>" for h in ("episode", "model", "tags", "disclosure", "budget",
                                               "tier", "turns used", "end reason", "reward"))
    rows = "".join(_episode_row(log) for log in logs)
    won = sum(1 for log in logs if (log.record or {}).get("outcome") == "success")
    name = task_id if task_id is not None else "(no task id)"
    body = (f"<nav><a href='{INDEX}'>all tasks</a></nav><h1>Task {_e(name)}</h1>"
            f"<p>{len(logs)} episodes, {won} succeeded.</p>"
            f"<table>{head and f'<tr>{head}<th class=num>calls</th></tr>'}{rows}</table>")
    return _page(f"Task {name}", body)


def index_page(tasks: Mapping[str | None, Sequence[EpisodeLog]], note: str = "") -> str:
    """Every task with its episodes' counts, linking to the task pages."""
    rows = []
    for task_id, logs in tasks.items():
        recs = [log.record or {} for log in logs]
        won = sum(1 for r in recs if r.get("outcome") == "success")
        out = sum(1 for r in recs if r.get("end_reason") == "exhausted")
        name = task_id if task_id is not None else "(no task id)"
        rows.append(f"<tr><td><a href='{task_page_name(task_id)}'>{_e(name)}</a></td>"
                    f"<td class=num>{len(logs)}</td><td class=num>{won}</td>"
                    f"<td class=num>{out}</td></tr>")  # fmt: skip
    body = ("<h1>Episodes by task</h1>" + (f"<p class=muted>{_e(note)}</p>" if note else "")
            + "<table><tr><th>task</th><th class=num>episodes</th><th class=num>succeeded</th>"
            f"<th class=num>exhausted</th></tr>{''.join(rows)}</table>")
    return _page("Episodes by task", body)


def by_task(logs: Iterable[EpisodeLog]) -> dict[str | None, list[EpisodeLog]]:
    """Episodes grouped by task id, tasks sorted by id (those without one last, as in the
    report), episodes in the order they first appear."""
    out: dict[str | None, list[EpisodeLog]] = {}
    for log in logs:
        out.setdefault(log.task_id, []).append(log)
    return dict(sorted(out.items(), key=lambda kv: (kv[0] is None, kv[0] or "")))


def site(logs: Sequence[EpisodeLog], note: str = "") -> dict[str, str]:
    """Every page of the view: file name → HTML. The index, one page per task, one per
    episode."""
    tasks = by_task(logs)
    pages = {INDEX: index_page(tasks, note)}
    for task_id, mine in tasks.items():
        pages[task_page_name(task_id)] = task_page(task_id, mine)
    for log in logs:
        pages[episode_page_name(log.episode_id)] = episode_page(log)
    return pages
