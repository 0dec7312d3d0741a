"""Claude-Code-like sessions for the session soak, and the upstream that checks their prompts.

A session speaks Anthropic Messages as Claude Code 2.1.197 does (docs/agents.md): `system` as
text blocks with `cache_control`, tools on every turn, the session id in
`X-Claude-Code-Session-Id`, `cache_control` moved to the latest message each turn, and the
first prompt of a conversation sent as a string, then as a one-text-block list (the content
shape flip). The conversation grows by the assistant's answer and a user message a turn
(tool results after a tool_use answer, a new prompt after a text answer). Once a session, at a
random turn mid-way, it sends the claude_code compaction request, then continues from the
summary alone. A small share of sessions is created with a small budget and stops at the
proxy's refusal, as Claude Code does.

`PromptWatch` is the fake upstream keeping the last prompt it received per session; after
each answered call the session checks that prompt: it extends the previous one (cache markers
and content shapes aside, as the proxy's own log reads them) and holds the budget text of
every turn since the conversation began or was compacted, each once.
"""

from __future__ import annotations

import asyncio
import collections
import random
import re
import time
import uuid
from array import array
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from soak_agents import Tally, Window
from targets import sse_data

from budgetproxy.testing import FakeUpstream

MODEL = "claude-sonnet-4-5"
HEADERS = {
    "Content-Type": "application/json",
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
    "x-api-key": "sk-soak",
    "User-Agent": "claude-cli/2.1.197 (external, cli)",
}
CACHE = {"type": "ephemeral"}
SYSTEM = [
    {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
     "cache_control": CACHE},
    {"type": "text", "cache_control": CACHE, "text": (
        "You are an interactive CLI tool that helps users with software engineering tasks. "
        "Use the instructions below and the tools available to you to assist the user. ") * 30},
]
TOOLS = [
    {"name": name, "description": f"{name}: {text} " * 6,
     "input_schema": {"type": "object", "properties": {
         arg: {"type": "string", "description": f"the {arg}"} for arg in args},
         "required": list(args)}}
    for name, text, args in (
        ("Bash", "runs a shell command in the working directory", ("command", "description")),
        ("Read", "reads a file from the local filesystem", ("file_path",)),
        ("Edit", "replaces an exact string in a file", ("file_path", "old_string",
                                                        "new_string")),
        ("Grep", "searches file contents with a regular expression", ("pattern", "path")),
    )
]
# Claude Code's compaction request: the CRITICAL line, then the prompt the claude_code preset
# matches (core/compaction.py), in a user message after the conversation; no tools are called.
COMPACT = ("CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n\n"
           "Your task is to create a detailed summary of the conversation so far, paying close "
           "attention to the user's explicit requests and your previous actions.")
CONTINUED = ("This session is being continued from a previous conversation that ran out of "
             "context. The conversation is summarized below:\n")
TOLD = re.compile(rb"\[Turn budget\] Turn (\d+) of \d+\.")
WORDS = ("the test fails because the parser reads one byte past the end of the buffer when a "
         "chunk ends inside a multi-byte character so we keep the tail and retry").split()


def text(rng: random.Random, tag: str) -> str:
    """A message of a few hundred to a few thousand characters."""
    size = int(rng.triangular(200, 4000, 600))
    words = [tag]
    while sum(len(w) + 1 for w in words) < size:
        words.append(rng.choice(WORDS))
    return " ".join(words)


def unmarked(value: Any) -> Any:
    """`value` without `cache_control` keys, and content of one text block as its string."""
    if isinstance(value, list):
        if (len(value) == 1 and isinstance(value[0], dict) and value[0].get("type") == "text"
                and isinstance(value[0].get("text"), str)):
            return value[0]["text"]
        return [unmarked(v) for v in value]
    if isinstance(value, dict):
        return {k: unmarked(v) for k, v in value.items() if k != "cache_control"}
    return value


def told_turns(messages: list[Any]) -> collections.Counter[int]:
    """How often each turn's budget text occurs in the user messages."""
    user = b"".join(orjson.dumps(m) for m in messages
                    if isinstance(m, dict) and m.get("role") == "user")
    return collections.Counter(int(n) for n in TOLD.findall(user))


def session_of(body: dict[str, Any]) -> str | None:
    """The session id in the request's metadata.user_id, as Claude Code writes it."""
    user = (body.get("metadata") or {}).get("user_id")
    if not isinstance(user, str) or "_session_" not in user:
        return None
    return user.rsplit("_session_", 1)[1]


class PromptWatch(FakeUpstream):
    """The fake upstream, keeping the last Messages prompt of each session until taken."""

    def __init__(self) -> None:
        super().__init__(("fake-model", MODEL), chunks=4, record=False)
        self.latest: dict[str, list[Any]] = {}

    async def _receive(self, request: web.Request) -> tuple[Any, web.Response | None]:
        parsed, fault = await super()._receive(request)
        if request.path == "/v1/messages" and isinstance(parsed, dict):
            sid = session_of(parsed)
            if sid is not None:
                self.latest[sid] = parsed.get("messages") or []
        return parsed, fault

    def take(self, sid: str) -> list[Any] | None:
        return self.latest.pop(sid, None)


@dataclass
class Session:
    sid: str
    budget: int | None  # None: the config's (large) default
    turns: int  # turns it means to take
    compact_at: int  # compacts after this many answered turns
    messages: list[Any] = field(default_factory=list)  # as the client keeps them
    fresh: bool = True  # messages[0] not sent yet: it goes as a string
    ok_turns: int = 0
    compactions: int = 0
    rejected: int = 0
    since: int = 1  # first turn whose text the current conversation holds
    prev: list[Any] | None = None  # the previous upstream prompt, unmarked


@dataclass
class Checks:
    """What the upstream prompts showed, over the run."""

    prompts_checked: int = 0
    prompts_unseen: int = 0  # answered calls the upstream kept no prompt for
    append_only_breaks: int = 0
    dropped_texts: int = 0  # (prompt, earlier turn) pairs missing that turn's text
    duplicated_texts: int = 0
    stale_texts: int = 0  # texts of turns before the conversation's start or compaction
    compactions_told: int = 0  # compaction prompts whose last message holds a budget text
    compactions_not_extending: int = 0  # compaction prompts not extending the previous one
    compaction_prompt_texts: int = 0  # budget texts in compaction prompts, all messages
    examples: list[dict[str, Any]] = field(default_factory=list)

    def note(self, what: str, **facts: Any) -> None:
        if len(self.examples) < 10:
            self.examples.append({"what": what, **facts})


@dataclass
class SessionLedger:
    ok_turns: collections.Counter[str] = field(default_factory=collections.Counter)
    compactions: collections.Counter[str] = field(default_factory=collections.Counter)
    rejected: collections.Counter[str] = field(default_factory=collections.Counter)
    ended: dict[str, str] = field(default_factory=dict)  # id -> end reason the proxy owes us
    errors: collections.Counter[str] = field(default_factory=collections.Counter)


class Sessions(Tally):
    """`slots` concurrent sessions, each followed by a new one, closed loop with think time."""

    def __init__(self, base_url: str, watch: PromptWatch, *, slots: int, turns: int,
                 small_share: float, stream_share: float, think_ms: float, seed: int) -> None:
        self.base_url = base_url.rstrip("/")
        self.watch = watch
        self.slots, self.turns, self.small_share = slots, turns, small_share
        self.stream_share, self.think_s = stream_share, think_ms / 1000
        self.rng = random.Random(seed)
        self.ledger = SessionLedger()
        self.checks = Checks()
        self.window = Window(time.monotonic())
        self.totals = Window(time.monotonic())
        self.all_latencies_ms = array("d")
        self.episodes_started = self.sessions_ended = 0
        self._t0 = 0.0
        self._deadline = 0.0

    async def run(self, seconds: float) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            self._t0 = time.monotonic()
            self._deadline = self._t0 + seconds
            await asyncio.gather(*(self._slot(http, i) for i in range(self.slots)))

    async def _slot(self, http: aiohttp.ClientSession, i: int) -> None:
        await asyncio.sleep(i * 0.25)  # sessions out of step from the start
        while time.monotonic() < self._deadline:
            await self._session(http, self._new_session())

    def _new_session(self) -> Session:
        rng = self.rng
        turns = rng.randint(self.turns // 2, self.turns)
        small = rng.random() < self.small_share and turns > 1
        s = Session(str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                    budget=rng.randint(min(10, turns - 1), turns - 1) if small else None,
                    turns=turns,
                    compact_at=rng.randint(turns * 2 // 5, turns * 3 // 5))
        s.messages = [{"role": "user", "content": text(rng, "prompt")}]
        return s

    # -- one session -------------------------------------------------------------------------
    async def _session(self, http: aiohttp.ClientSession, s: Session) -> None:
        if s.budget is not None:  # as docs/agents.md: the episode created with its budget
            async with http.post(f"{self.base_url}/episodes", json={
                    "episode_id": s.sid, "budget": s.budget}) as resp:
                await resp.read()
                if resp.status != 201:
                    self._error(f"create: {resp.status}")
                    return
        self.episodes_started += 1
        end = "failure"
        while time.monotonic() < self._deadline:
            if s.ok_turns == s.compact_at and not s.compactions:
                if not await self._compact(http, s):
                    break
                continue
            if s.ok_turns >= s.turns:
                end = "success"
                break
            status = await self._turn(http, s)
            if status != "ok":
                break
            await asyncio.sleep(self.think_s * self.rng.uniform(0.5, 1.5))
        await self._report(http, s, end)

    def _wire(self, s: Session, messages: list[Any]) -> list[Any]:
        """The messages as Claude Code sends them this turn."""
        out = list(messages)
        first = out[0]
        if not s.fresh and isinstance(first["content"], str):
            out[0] = {"role": first["role"], "content": [
                {"type": "text", "text": first["content"], "cache_control": CACHE}]}
        last = out[-1]
        content = last["content"]
        if isinstance(content, list):
            blocks = list(content)
            blocks[-1] = {**blocks[-1], "cache_control": CACHE}
            out[-1] = {"role": last["role"], "content": blocks}
        return out

    def _body(self, s: Session, messages: list[Any], stream: bool, tools: bool) -> bytes:
        body: dict[str, Any] = {
            "model": MODEL, "max_tokens": 32000, "system": SYSTEM,
            "messages": self._wire(s, messages),
            "metadata": {"user_id": f"user_{'0' * 64}_account__session_{s.sid}"},
            "stream": stream,
        }
        if tools:
            body["tools"] = TOOLS
        return orjson.dumps(body)

    async def _call(self, http: aiohttp.ClientSession, s: Session, body: bytes, stream: bool,
                    ) -> tuple[int, list[dict[str, Any]] | None, str]:
        """(status, the answer's content blocks, error text) of one Messages call."""
        self._count("scheduled")
        started = time.monotonic()
        headers = {**HEADERS, "X-Claude-Code-Session-Id": s.sid}
        try:
            async with http.post(self.base_url + "/messages?beta=true", data=body,
                                 headers=headers) as resp:
                if resp.status != 200:
                    return resp.status, None, (await resp.read()).decode(errors="replace")
                if not stream:
                    return 200, orjson.loads(await resp.read())["content"], ""
                blocks: list[dict[str, Any]] = []
                partial: dict[int, str] = {}
                async for payload in sse_data(resp.content):
                    event = orjson.loads(payload)
                    kind = event.get("type")
                    if kind == "content_block_start":
                        blocks.append(dict(event["content_block"]))
                    elif kind == "content_block_delta":
                        delta = event["delta"]
                        if delta["type"] == "text_delta":
                            blocks[event["index"]]["text"] += delta["text"]
                        else:
                            i = event["index"]
                            partial[i] = partial.get(i, "") + delta["partial_json"]
                    elif kind == "message_stop":
                        for i, raw in partial.items():
                            blocks[i]["input"] = orjson.loads(raw)
                        return 200, blocks, ""
                return 200, None, "stream ended without message_stop"
        except (TimeoutError, aiohttp.ClientError, ValueError, KeyError, IndexError) as exc:
            return 0, None, type(exc).__name__
        finally:
            latency = (time.monotonic() - started) * 1000
            self._count("completed")
            self.window.latencies_ms.append(latency)
            self.all_latencies_ms.extend((started - self._t0, latency))

    async def _turn(self, http: aiohttp.ClientSession, s: Session) -> str:
        stream = self.rng.random() < self.stream_share
        status, blocks, err = await self._call(
            http, s, self._body(s, s.messages, stream, tools=True), stream)
        if status in (400, 403) and "turn_budget_exhausted" in err:
            s.rejected += 1
            self.ledger.rejected[s.sid] += 1
            self._count("rejected")
            if s.budget is None or s.ok_turns != s.budget:
                self._error(f"refused at turn {s.ok_turns + 1} of budget {s.budget}")
            return "refused"
        if status != 200 or blocks is None:
            self._error(f"turn: {status} {err[:120]}")
            return "error"
        s.fresh = False
        s.ok_turns += 1
        self.ledger.ok_turns[s.sid] += 1
        self._count("ok")
        self._count("streams", stream)
        self._check_prompt(s)
        s.messages.append({"role": "assistant", "content": blocks})
        uses = [b for b in blocks if b.get("type") == "tool_use"]
        if uses:
            s.messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": b["id"],
                 "content": text(self.rng, f"result {s.ok_turns}")} for b in uses]})
        else:
            s.messages.append({"role": "user", "content": [
                {"type": "text", "text": text(self.rng, f"prompt {s.ok_turns}")}]})
        return "ok"

    def _check_prompt(self, s: Session) -> None:
        sent = self.watch.take(s.sid)
        c = self.checks
        if sent is None:
            c.prompts_unseen += 1
            return
        c.prompts_checked += 1
        flat = unmarked(sent)
        turn = s.ok_turns
        if s.prev is not None and flat[: len(s.prev)] != s.prev:
            c.append_only_breaks += 1
            at = next((i for i, (a, b) in enumerate(zip(flat, s.prev, strict=False)) if a != b),
                      min(len(flat), len(s.prev)))
            c.note("append-only break", session=s.sid, turn=turn, first_difference=at,
                   previous_length=len(s.prev), length=len(flat))
        told = told_turns(sent)
        for k in range(s.since, turn + 1):
            n = told.get(k, 0)
            if n == 0:
                c.dropped_texts += 1
                c.note("dropped text", session=s.sid, turn=turn, text_of_turn=k)
            elif n > 1:
                c.duplicated_texts += 1
                c.note("duplicated text", session=s.sid, turn=turn, text_of_turn=k, times=n)
        stale = sum(n for k, n in told.items() if not s.since <= k <= turn)
        if stale:
            c.stale_texts += stale
            c.note("stale texts", session=s.sid, turn=turn,
                   turns=sorted(k for k in told if not s.since <= k <= turn))
        s.prev = flat

    async def _compact(self, http: aiohttp.ClientSession, s: Session) -> bool:
        """Claude Code's compaction call; then the summary alone is the conversation."""
        asked = [*s.messages]
        if asked[-1]["role"] == "user":  # the compaction prompt follows the user's last one
            asked[-1] = {"role": "user", "content": [
                *self._blocks(asked[-1]["content"]), {"type": "text", "text": COMPACT}]}
        else:
            asked.append({"role": "user", "content": [{"type": "text", "text": COMPACT}]})
        stream = self.rng.random() < self.stream_share
        status, blocks, err = await self._call(
            http, s, self._body(s, asked, stream, tools=False), stream)
        if status != 200 or blocks is None:
            self._error(f"compaction: {status} {err[:120]}")
            return False
        s.compactions += 1
        self.ledger.compactions[s.sid] += 1
        sent = self.watch.take(s.sid)
        if sent is not None:
            self.checks.compaction_prompt_texts += sum(told_turns(sent).values())
            if told_turns(sent[-1:]):
                self.checks.compactions_told += 1
                self.checks.note("compaction told", session=s.sid, turn=s.ok_turns)
            if s.prev is not None and unmarked(sent)[: len(s.prev)] != s.prev:
                self.checks.compactions_not_extending += 1
        # The summary is the client's own text: the fake upstream's answer echoes the
        # compaction prompt, which no model's summary repeats (and which would make the next
        # call a compaction call too).
        s.messages = [{"role": "user", "content": CONTINUED + text(self.rng, "summary")}]
        s.fresh, s.prev, s.since = True, None, s.ok_turns + 1
        return True

    @staticmethod
    def _blocks(content: Any) -> list[Any]:
        return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)

    async def _report(self, http: aiohttp.ClientSession, s: Session, end: str) -> None:
        """The outcome, as a harness around Claude Code reports it; the end reason owed."""
        self.sessions_ended += 1
        self.watch.latest.pop(s.sid, None)  # a prompt an erring call left
        if not s.ok_turns and not s.rejected:
            return  # no call reached the proxy's episode: nothing to end
        body: dict[str, Any] = {"success": end == "success", "metadata": {"soak": "sessions"}}
        if end == "success":
            body["success_turn"] = s.ok_turns
        try:
            async with http.post(f"{self.base_url}/episodes/{s.sid}/outcome",
                                 json=body) as resp:
                await resp.read()
                status = resp.status
        except (TimeoutError, aiohttp.ClientError) as exc:
            self._error(f"outcome: {type(exc).__name__}")
            return
        if status != 200:
            self._error(f"outcome: {status}")
            return
        self._count("outcomes")
        spent = s.rejected > 0 or (s.budget is not None and s.ok_turns >= s.budget)
        # success (reported) > exhausted > failure (reported): CONTRACT.md's precedence.
        self.ledger.ended[s.sid] = "success" if end == "success" else (
            "exhausted" if spent else "failure")

    def figures(self) -> dict[str, Any]:
        """The running counts a progress line and each sample carry."""
        c = self.checks
        return {"sessions_ended": self.sessions_ended,
                "compactions": sum(self.ledger.compactions.values()),
                "prompts_checked": c.prompts_checked,
                "append_only_breaks": c.append_only_breaks, "dropped_texts": c.dropped_texts}

