"""Open-loop agent load for the soak run: episodes rotating through fixed slots at a fixed rate.

A slot is one agent. It holds one episode at a time and has at most one model call in flight;
its conversation grows as an agent's does (the previous assistant reply, then a new user
message). A scheduler fires model calls at a fixed rate, each from the longest-waiting ready
slot, and measures latency from the *scheduled* time, so a stall shows up in the latency
instead of silently lowering the rate (no coordinated omission). When an episode succeeds,
gives up or spends its budget, the slot reports the outcome and takes a new episode id.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import time
from array import array
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import orjson
from targets import sse_data

MODEL = "fake-model"
SYSTEM = (
    "You are a careful software agent. Work in small steps: read the task, call a tool, read "
    "its result, and finish with a short summary of what you changed and why. "
) * 2
OBSERVATION = (
    "tool output: {n} files matched, exit status {status}; the relevant lines were "
    "{a}, {b} and {c}; the test suite reported {fails} failures in module_{m}.py. "
)


@dataclass
class Episode:
    episode_id: str
    task: str
    budget: int
    needs: int  # turns this attempt would need to succeed (> budget: it runs out)
    gives_up: int | None  # a turn after which it reports failure early
    probe: bool  # after spending its budget, send one more call (expects 403)
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns_ok: int = 0
    sent: bool = False
    probed: bool = False


@dataclass
class Window:
    """What happened between two samples."""

    started: float
    scheduled: int = 0
    completed: int = 0  # model calls answered (any status)
    ok: int = 0
    streams: int = 0
    rejected: int = 0  # expected 403 turn_budget_exhausted (over-budget probes)
    outcomes: int = 0
    errors: int = 0
    unsent: int = 0  # a call was due and no slot was ready
    latencies_ms: list[float] = field(default_factory=list)


class Load(Protocol):
    """What the soak's sampling and figures read from a load generator."""

    totals: Window  # the whole run, latencies not kept
    all_latencies_ms: array[float]  # (elapsed s, latency ms) pairs, flattened
    episodes_started: int

    def take_window(self) -> Window: ...

    async def run(self, seconds: float) -> None: ...


@dataclass
class Ledger:
    """Per-episode facts, to check the trajectory log against at the end."""

    ok_turns: collections.Counter[str] = field(default_factory=collections.Counter)
    rejected: collections.Counter[str] = field(default_factory=collections.Counter)
    budget: dict[str, int] = field(default_factory=dict)
    ended: dict[str, str] = field(default_factory=dict)  # id -> end reason the proxy owes us
    errors: collections.Counter[str] = field(default_factory=collections.Counter)


class Tally:
    """What a load counts as it runs: `window` since the last sample (`take_window`),
    `totals` over the run, and each error by kind in `ledger.errors`."""

    window: Window
    totals: Window
    ledger: Any

    def take_window(self) -> Window:
        w, self.window = self.window, Window(time.monotonic())
        return w

    def _count(self, what: str, n: int = 1) -> None:
        for w in (self.window, self.totals):
            setattr(w, what, getattr(w, what) + n)

    def _error(self, what: str) -> None:
        self._count("errors")
        self.ledger.errors[what] += 1


class AgentLoad(Tally):
    def __init__(
        self,
        base_url: str,
        *,
        rate: float,
        slots: int,
        stream_share: float,
        max_turns: int = 20,
        seed: int = 0,
        prefix: str = "soak",
        timeout_s: float = 30.0,
        shutdown_ends_episodes: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.rate = rate
        self.slots = slots
        self.stream_share = stream_share
        self.max_turns = max_turns
        self.rng = random.Random(seed)
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.shutdown_ends_episodes = shutdown_ends_episodes
        self.ledger = Ledger()
        self.window = Window(time.monotonic())
        self.totals = Window(time.monotonic())  # the whole run, latencies not kept
        self.all_latencies_ms = array("d")  # (elapsed s, latency ms) pairs, flattened
        self.episodes_started = 0
        self._serial = 0
        self._ready: collections.deque[Episode] = collections.deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self._t0 = 0.0
        self.session: aiohttp.ClientSession | None = None

    # -- episodes ------------------------------------------------------------------------------
    def _new_episode(self) -> Episode:
        self._serial += 1
        task = f"task-{self.rng.randrange(200):03d}"
        # BudgetMix-like tiers of a 20-turn task: 25, 50, 75 and 100 %.
        budget = self.max_turns * self.rng.choice((1, 2, 3, 4)) // 4
        needs = self.rng.randint(1, self.max_turns * 3 // 2)
        gives_up = self.rng.randint(1, budget) if self.rng.random() < 0.1 else None
        ep = Episode(f"{self.prefix}-{self._serial:07d}", task, budget, needs, gives_up,
                     probe=self.rng.random() < 0.2)
        ep.messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Task {task}: fix the failing test in the repository "
                                        f"and explain the change. Attempt {self._serial}."},
        ]
        self.ledger.budget[ep.episode_id] = budget
        return ep

    def _observation(self, ep: Episode) -> str:
        r = self.rng
        return OBSERVATION.format(n=r.randrange(40), status=r.choice((0, 1, 2)),
                                  a=r.randrange(900), b=r.randrange(900), c=r.randrange(900),
                                  fails=r.randrange(9), m=r.randrange(30)) * r.randint(1, 3)

    def _headers(self, ep: Episode) -> dict[str, str]:
        return {
            "Content-Type": "application/json",
            "X-Episode-Id": ep.episode_id,
            "X-Episode-Budget": str(ep.budget),
            "X-Episode-Max-Turns": str(self.max_turns),
            "X-Episode-Task": ep.task,
        }

    # -- one step of one slot ------------------------------------------------------------------
    async def _step(self, ep: Episode, due: float) -> None:
        try:
            await self._turn(ep, due)
        except Exception as exc:  # never lose a slot to a surprise: count it, start afresh
            self._error(f"load generator: {type(exc).__name__}: {exc}")
            self._ready.append(self._new_episode())

    async def _turn(self, ep: Episode, due: float) -> None:
        assert self.session is not None
        stream = self.rng.random() < self.stream_share
        body: dict[str, Any] = {"model": MODEL, "messages": ep.messages, "max_tokens": 256}
        if stream:
            body["stream"] = True
        probe = ep.turns_ok >= ep.budget
        if not ep.sent:
            ep.sent = True
            self.episodes_started += 1
        status, reply, err = await self._call(ep, body, stream)
        now = time.monotonic()
        self._count("completed")
        latency = (now - due) * 1000
        self.window.latencies_ms.append(latency)  # a sample may have rotated the window
        self.all_latencies_ms.extend((due - self._t0, latency))
        done: str | None = None
        if probe:
            ep.probed = True
            if status == 403 and err == "turn_budget_exhausted":
                self._count("rejected")
                self.ledger.rejected[ep.episode_id] += 1
            else:
                self._error(f"probe: {err or status}")
            done = "exhausted"
        elif status == 200 and reply is not None:
            self._count("ok")
            self._count("streams", stream)
            ep.turns_ok += 1
            self.ledger.ok_turns[ep.episode_id] += 1
            ep.messages.append({"role": "assistant", "content": reply})
            ep.messages.append({"role": "user", "content": self._observation(ep)})
            if ep.turns_ok >= ep.needs:
                done = "success"
            elif ep.gives_up is not None and ep.turns_ok >= ep.gives_up:
                done = "failure"
            elif ep.turns_ok >= ep.budget and not ep.probe:
                done = "exhausted"
        else:
            self._error(err or f"HTTP {status}")
            done = "abandon"  # a broken episode: report it and move on
        if done is not None:
            await self._report(ep, done)
            ep = self._new_episode()
        self._ready.append(ep)

    async def _call(
        self, ep: Episode, body: dict[str, Any], stream: bool
    ) -> tuple[int, str | None, str | None]:
        """(status, assistant text, error code) of one chat completion call."""
        assert self.session is not None
        url = self.base_url + "/chat/completions"
        try:
            async with self.session.post(url, data=orjson.dumps(body),
                                         headers=self._headers(ep)) as resp:
                if resp.status != 200:
                    data = await resp.read()
                    with contextlib.suppress(ValueError, AttributeError, TypeError):
                        return resp.status, None, orjson.loads(data)["error"]["code"]
                    return resp.status, None, f"HTTP {resp.status}"
                if not stream:
                    data = orjson.loads(await resp.read())
                    return 200, data["choices"][0]["message"]["content"] or "", None
                parts: list[str] = []
                async for payload in sse_data(resp.content):
                    if payload == b"[DONE]":
                        return 200, "".join(parts), None
                    choices = orjson.loads(payload).get("choices") or []
                    if choices:
                        parts.append((choices[0].get("delta") or {}).get("content") or "")
                return 200, None, "stream ended without [DONE]"
        except (TimeoutError, aiohttp.ClientError, ValueError, KeyError, IndexError) as exc:
            return 0, None, type(exc).__name__

    async def _report(self, ep: Episode, done: str) -> None:
        """POST the outcome; remember which end reason the episode record must carry."""
        assert self.session is not None
        success = done == "success"
        body: dict[str, Any] = {"success": success, "metadata": {"soak": True}}
        if success:
            body["success_turn"] = ep.turns_ok
        url = f"{self.base_url}/episodes/{ep.episode_id}/outcome"
        try:
            async with self.session.post(url, data=orjson.dumps(body),
                                         headers={"Content-Type": "application/json"}) as resp:
                await resp.read()
                ok = resp.status == 200
                status = str(resp.status)
        except (TimeoutError, aiohttp.ClientError) as exc:
            ok, status = False, type(exc).__name__
        if not ok and status == "404" and ep.turns_ok == 0:
            return  # its only call failed before the proxy created the episode
        if not ok:
            self._error(f"outcome: {status}")
            return
        self._count("outcomes")
        spent = ep.turns_ok >= ep.budget or ep.probed
        # success (reported) > exhausted > failure (reported): CONTRACT.md's precedence.
        self.ledger.ended[ep.episode_id] = (
            "success" if success else "exhausted" if spent else "failure"
        )

    # -- the schedule --------------------------------------------------------------------------
    async def run(self, seconds: float) -> None:
        """Fire calls at `rate` per second for `seconds`, then let the in-flight ones finish."""
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            self.session = session
            self._ready.extend(self._new_episode() for _ in range(self.slots))
            # time.monotonic, not loop.time: uvloop's clock is cached at millisecond steps.
            self._t0 = start = time.monotonic()
            sent = 0
            total = int(seconds * self.rate)
            while sent < total:
                now = time.monotonic()
                due_count = min(total, int((now - start) * self.rate) + 1)
                while sent < due_count:
                    due = start + sent / self.rate
                    sent += 1
                    self._count("scheduled")
                    if not self._ready:
                        self._count("unsent")
                        continue
                    task = asyncio.create_task(self._step(self._ready.popleft(), due))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                await asyncio.sleep(max(0.0, start + sent / self.rate - time.monotonic()))
            if self._tasks:
                await asyncio.wait(set(self._tasks), timeout=self.timeout_s + 5)
            # Episodes still in the slots are ended by the proxy at SIGTERM (memory store; the
            # Redis store leaves them to the other replicas, so no record is due for them).
            for ep in self._ready if self.shutdown_ends_episodes else ():
                if ep.turns_ok:
                    self.ledger.ended[ep.episode_id] = (
                        "exhausted" if ep.turns_ok >= ep.budget else "abandoned"
                    )
            self.session = None
