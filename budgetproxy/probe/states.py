"""Probe states: conversation prefixes rebuilt from trajectory logs, and the matched sample."""

from __future__ import annotations

import functools
import gzip
import hashlib
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from budgetproxy.core import disclosure
from budgetproxy.probe import replay

SIDES = ("a", "b")


class ProbeInputError(ValueError):
    """The logs or the selection cannot give a probe its states (said in one line)."""


@dataclass(frozen=True)
class State:
    """One decision point: what the agent had sent when the model answered a turn."""

    task_id: str
    source: str  # "a" | "b": whose trajectory the state comes from
    episode_id: str
    turn: int
    fraction: float  # turn / turns used in its episode: how far into the trajectory
    conversation: tuple[dict[str, Any], ...]  # the agent's messages (what a client sends)
    messages: tuple[dict[str, Any], ...]  # what the model saw: with the disclosure placed
    disclosure: str  # the episode's arm
    budget: int | None
    max_turns: int | None
    remaining: int | None  # turns the episode had left, this one included
    action: dict[str, Any] | None = None  # the source policy's own logged reply
    injected: str | None = None  # "tool-error" | "action" when an error was put in
    failed_call: str | None = None  # name(arguments) of the call an injected error failed
    meta: Mapping[str, Any] = field(default_factory=dict)
    # the API it was served on (probe/replay.py): it is replayed there, in that shape
    route: str = "/v1/chat/completions"
    head: Any = None  # Messages' system or Responses' instructions, as the model saw them

    @property
    def key(self) -> str:
        """The state's identity in one run: episode, turn and any injected error."""
        return f"{self.episode_id}#{self.turn}" + (f"!{self.injected}" if self.injected else "")

    @functools.cached_property
    def digest(self) -> str:
        """What the model sees, hashed: the same in every run over the same logs, where
        episode ids and log order are not (sampling seeds and order derive from it)."""
        return hashlib.sha256(orjson.dumps(self.messages, option=orjson.OPT_SORT_KEYS)
                              ).hexdigest()

    def order(self) -> tuple[str, float, int, str]:
        """A canonical order of states: by content, then where in an episode it was."""
        return (self.digest, self.fraction, self.remaining or 0, self.episode_id)

    def origin(self) -> dict[str, Any]:
        """Where the state came from, as the report lists it."""
        return {"task_id": self.task_id, "policy": self.source, "episode_id": self.episode_id,
                "turn": self.turn, "fraction": round(self.fraction, 4),
                "injected": self.injected}


@dataclass
class Episode:
    """An episode record with the turns the log holds for it."""

    record: dict[str, Any]
    turns: list[dict[str, Any]] = field(default_factory=list)


def log_files(paths: Iterable[str | Path]) -> list[Path]:
    """Every JSONL file (rotated `.jsonl.gz` too) named or under a named folder, each once."""
    out: dict[Path, None] = {}
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            for f in sorted([*p.rglob("*.jsonl"), *p.rglob("*.jsonl.gz")]):
                out[f.resolve()] = None
        elif p.exists():
            out[p.resolve()] = None
        else:
            raise ProbeInputError(f"no such file or folder: {raw}")
    return list(out)


def read_episodes(paths: Iterable[str | Path]) -> dict[str, Episode]:
    """Finished episodes and their turn records, by episode id (other lines are skipped)."""
    episodes: dict[str, Episode] = {}
    turns: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for path in log_files(paths):
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as fh:
            for line in fh:
                try:
                    rec = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if not isinstance(rec, dict) or not isinstance(rec.get("episode_id"), str):
                    continue
                if rec.get("type") == "episode":
                    episodes[rec["episode_id"]] = Episode(rec)
                elif rec.get("type") == "turn":
                    turns[rec["episode_id"]].append(rec)
    for eid, ep in episodes.items():
        ep.turns = sorted(turns.get(eid, []), key=lambda r: (r.get("turn", 0),
                                                             r.get("attempt", 0)))
    return episodes


def field_value(record: Mapping[str, Any], name: str) -> Any:
    """An episode field by name: a top-level field, `tags.X`, or a bare tag name."""
    if name.startswith("tags."):
        tags = record.get("tags") or {}
        return tags.get(name[5:]) if isinstance(tags, dict) else None
    if name in record:
        return record[name]
    tags = record.get("tags") or {}
    return tags.get(name) if isinstance(tags, dict) else None


def parse_selector(text: str) -> tuple[str, str]:
    """`FIELD=VALUE` → (field, value)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise ProbeInputError(f"expected FIELD=VALUE (e.g. model=gpt-x), got {text!r}")
    return name.strip(), value.strip()


def matches(record: Mapping[str, Any], selector: tuple[str, str]) -> bool:
    value = field_value(record, selector[0])
    return value is not None and str(value) == selector[1]


def _stripped(messages: Sequence[Any]) -> bool:
    return any(isinstance(m, dict) and isinstance(m.get("content"), dict) for m in messages)


def episode_states(ep: Episode, source: str, placement: str = "last_message") -> list[State]:
    """A state per answered turn of one episode, in turn order; the disclosure texts placed
    as the proxy's `placement` placed them (probe/replay.py)."""
    rec = ep.record
    task_id, budget = rec.get("task_id"), rec.get("budget")
    used = max([int(rec.get("turns_used") or 0), *(int(t.get("turn", 0)) for t in ep.turns)])
    conv: list[Any] = []
    placed: list[tuple[int, str]] = []  # earlier turns' disclosure texts: (index, text)
    by_turn: dict[int, State] = {}
    head: Any = None
    for t in ep.turns:
        route = replay.route_of(t)
        if replay.HEADS.get(route) in t:  # logged with the whole conversation
            head = t[replay.HEADS[route]]
        offset, new = t.get("messages_offset"), t.get("request_messages")
        if not isinstance(offset, int) or not isinstance(new, list):
            continue
        if _stripped(new):
            raise ProbeInputError(
                f"episode {ep.record['episode_id']}: its turns were logged without texts "
                "(trajectories.content: none); probe needs content: full")
        conv = conv[:offset] + new
        if not conv:
            continue
        text = (t.get("disclosure") or {}).get("text")
        seen, seen_head = [*conv], head
        if isinstance(text, str):
            seen, seen_head, placed = replay.place(route, conv, head, text, placed, placement)
        if t.get("status") != "ok" or not isinstance(t.get("response"), dict):
            continue
        turn = int(t.get("turn", 0))
        by_turn[turn] = State(
            task_id=str(task_id), source=source, episode_id=str(rec["episode_id"]), turn=turn,
            fraction=turn / used if used else 1.0,
            conversation=tuple(conv), messages=tuple(seen), disclosure=str(rec.get("disclosure")),
            budget=budget if isinstance(budget, int) else None,
            max_turns=rec.get("max_turns") if isinstance(rec.get("max_turns"), int) else None,
            remaining=budget - turn + 1 if isinstance(budget, int) else None,
            action=t["response"], route=route, head=seen_head,
        )
    return [by_turn[k] for k in sorted(by_turn)]


def since_last_action(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The messages after the last assistant message: what the last action led to."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "assistant":
            return list(messages[i + 1 :])
    return []


def message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content
                         if isinstance(p, dict) and "text" in p)
    return ""


def holds_error(state: State, pattern: re.Pattern[str] | None) -> bool:
    """Whether what the last action led to (tool results, the next user message) matches."""
    if pattern is None:
        return False
    return any(pattern.search(message_text(m)) for m in since_last_action(state.conversation))


@dataclass
class Selection:
    """Each policy's states by task, and the model it was served by."""

    states: dict[str, dict[str, list[State]]]  # side → task → states
    models: dict[str, str]
    episodes: dict[str, int]


def select(
    episodes: Mapping[str, Episode], a: tuple[str, str], b: tuple[str, str],
    placement: str = "last_message",
) -> Selection:
    """The states of A's and B's own finished episodes (with a task id), by task."""
    states: dict[str, dict[str, list[State]]] = {s: defaultdict(list) for s in SIDES}
    models: dict[str, Counter[str]] = {s: Counter() for s in SIDES}
    counts = dict.fromkeys(SIDES, 0)
    for ep in episodes.values():
        rec = ep.record
        if rec.get("task_id") is None or isinstance(rec.get("tags"), dict) and (
                "probe" in rec["tags"]):
            continue  # no task to stratify by, or a probe's own continuation
        for side, selector in zip(SIDES, (a, b), strict=True):
            if not matches(rec, selector):
                continue
            counts[side] += 1
            for st in episode_states(ep, side, placement):
                states[side][st.task_id].append(st)
            for t in ep.turns:
                if isinstance(t.get("model"), str):
                    models[side][t["model"]] += 1
    for side, selector in zip(SIDES, (a, b), strict=True):
        if not counts[side]:
            raise ProbeInputError(f"no finished episode with a task_id has "
                                  f"{selector[0]}={selector[1]}")
    if a == b:
        raise ProbeInputError("--a and --b select the same episodes")
    chosen = {s: models[s].most_common(1)[0][0] for s in SIDES if models[s]}
    return Selection(states={s: dict(v) for s, v in states.items()}, models=chosen,
                     episodes=counts)


def matched_sample(
    pools: Mapping[str, Mapping[str, Sequence[State]]], n: int, rng: random.Random,
) -> list[State]:
    """`n` states (rounded down to even), half from A's trajectories and half from B's, task by
    task: each task gives the same number from each side, spread over tasks evenly."""
    tasks = sorted(set(pools["a"]) & set(pools["b"]))
    room = {t: min(len(pools["a"][t]), len(pools["b"][t])) for t in tasks}
    quota = dict.fromkeys(tasks, 0)
    pairs = n // 2
    while pairs > 0 and any(quota[t] < room[t] for t in tasks):
        for t in tasks:
            if pairs > 0 and quota[t] < room[t]:
                quota[t] += 1
                pairs -= 1
    out: list[State] = []
    for t in tasks:
        for side in SIDES:
            out += rng.sample(sorted(pools[side][t], key=State.order), quota[t])
    return out


def split_pools(
    pools: Mapping[str, Mapping[str, Sequence[State]]], pattern: re.Pattern[str] | None,
) -> tuple[dict[str, dict[str, list[State]]], dict[str, dict[str, list[State]]]]:
    """(states without an error, states that already hold one) by side and task."""
    plain: dict[str, dict[str, list[State]]] = {s: {} for s in SIDES}
    errs: dict[str, dict[str, list[State]]] = {s: {} for s in SIDES}
    for side, by_task in pools.items():
        for task, states in by_task.items():
            for st in states:
                dest = errs if holds_error(st, pattern) else plain
                dest[side].setdefault(task, []).append(st)
    return plain, errs


def with_messages(state: State, conversation: list[dict[str, Any]], injected: str,
                  failed_call: str | None = None) -> State:
    """The state with messages rewritten in place (an injected error; same length). The model
    sees each rewritten message with the disclosure text it carried still on it."""
    if len(conversation) != len(state.conversation):
        raise ValueError("an injection rewrites messages; it never adds or drops one")
    seen = list(state.messages) if len(state.messages) == len(conversation) else None
    out: list[dict[str, Any]] = []
    for i, (new, old) in enumerate(zip(conversation, state.conversation, strict=True)):
        if seen is None:
            out.append(new)
        elif new == old:
            out.append(seen[i])
        else:
            was, sent = message_text(seen[i]), message_text(old)
            tail = was[len(sent):].removeprefix("\n\n") if was.startswith(sent) else ""
            out.append(disclosure.apply([new], "last_message", tail)[0] if tail else new)
    return replace(state, conversation=tuple(conversation), messages=tuple(out),
                   injected=injected, failed_call=failed_call, action=None)
