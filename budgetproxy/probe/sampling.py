"""Next actions: G replies per state and policy, sampled through a running proxy as probe calls."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from budgetproxy.probe import replay
from budgetproxy.probe.states import State

PROBE_HEADER = "X-Budgetproxy-Probe"  # the proxy forwards these calls and counts none of them


def sample_seed(seed: int, *parts: object) -> int:
    """A stable 31-bit request seed per (probe seed, state, policy, sample)."""
    digest = hashlib.sha256(repr((seed, *parts)).encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


def assistant_message(message: Any) -> dict[str, Any]:
    """The reply as a chat message dict (content, tool_calls)."""
    calls = [
        {"id": c.id, "type": "function",
         "function": {"name": c.function.name, "arguments": c.function.arguments}}
        for c in message.tool_calls or [] if getattr(c, "function", None) is not None
    ]
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    if calls:
        out["tool_calls"] = calls
    return out


@dataclass
class Sampled:
    """The actions sampled per (state key, side), and the calls that failed."""

    actions: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    calls: int = 0


async def sample_actions(
    proxy_url: str, states: Sequence[State], models: dict[str, str], samples: int, *,
    seed: int, probe_id: str, api_key: str = "probe", tools: list[Any] | None = None,
    concurrency: int = 16, timeout_s: float = 120.0,
) -> Sampled:
    """`samples` replies from each side's model for every state, `concurrency` at a time. Each
    call sends what the model saw at that state (its disclosure included), no episode id, and
    the probe header, so the proxy routes it as any call and no budget is spent."""
    import openai
    from openai.types.chat import ChatCompletion

    out = Sampled()
    got: dict[tuple[str, str, int], dict[str, Any]] = {}
    gate = asyncio.Semaphore(concurrency)
    async with openai.AsyncOpenAI(
        base_url=f"{proxy_url.rstrip('/')}/v1", api_key=api_key, timeout=timeout_s,
        max_retries=2, default_headers={PROBE_HEADER: probe_id},
    ) as client:

        async def one(state: State, side: str, g: int) -> None:
            body = replay.body(state.route, state.messages, state.head, models[side],
                               sample_seed(seed, state.digest, side, g), tools)
            async with gate:
                try:
                    # The documented low-level post: the typed create() re-walks every message.
                    # Each state goes back to the route it came from, in that API's shape.
                    path = state.route.removeprefix("/v1")
                    if state.route != replay.CHAT:
                        raw = await client.post(path, body=body, cast_to=object)
                        action = replay.action_of(state.route, raw)
                        if action is not None:
                            got[(state.key, side, g)] = action
                        return
                    reply = await client.post(path, body=body, cast_to=ChatCompletion)
                except openai.APIError as e:
                    code = f" {e.code}" if getattr(e, "code", None) else ""
                    out.failures.append(f"{models[side]} on {state.key}: "
                                        f"{type(e).__name__}{code}: {e.message}")
                    return
                finally:
                    out.calls += 1
            if reply.choices:
                got[(state.key, side, g)] = assistant_message(reply.choices[0].message)

        await asyncio.gather(*(one(st, side, g) for st in states for side in models
                               for g in range(samples)))
    for (key, side, _), action in sorted(got.items(), key=lambda kv: kv[0]):
        out.actions.setdefault((key, side), []).append(action)  # in sample order, as sent
    return out
