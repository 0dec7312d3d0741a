"""Continuations: from the same states, each policy plays on to the end as a new episode."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from budgetproxy.probe.sampling import sample_seed
from budgetproxy.probe.states import State
from budgetproxy.probe.stats import Continued

# A scorer module's `continue_episode(state, *, model, proxy, llm, seed, tags) -> bool`: play
# `model` on from `state` in a new episode created on `proxy` (an AsyncBudgetClient) with the
# state's remaining budget, talking through `llm` (an openai.AsyncOpenAI bound to the proxy);
# True when the episode ended in success. Its episodes carry `tags` (they hold "probe") and no
# task_id, so `budgetproxy analyze` leaves them out and counts them.
ContinueFn = Callable[..., Any]


async def run_continuations(
    proxy_url: str, states: Sequence[State], models: dict[str, str], play_on: ContinueFn, *,
    rollouts: int, seed: int, probe_id: str, api_key: str = "probe", concurrency: int = 16,
) -> tuple[list[Continued], list[str]]:
    """`rollouts` continuations per state and policy; the share of each side's that succeeded,
    per state, and what failed."""
    import openai

    from budgetproxy.client import AsyncBudgetClient

    gate = asyncio.Semaphore(concurrency)
    wins: dict[tuple[str, str], list[float]] = {}
    failures: list[str] = []
    async with (
        AsyncBudgetClient(proxy_url, api_key=api_key) as proxy,
        openai.AsyncOpenAI(base_url=f"{proxy_url.rstrip('/')}/v1", api_key=api_key,
                           timeout=120, max_retries=2) as llm,
    ):

        async def one(state: State, side: str, r: int) -> None:
            tags = {"probe": probe_id, "probe_policy": side, "probe_state": state.key,
                    "task": state.task_id}
            async with gate:
                try:
                    won = await play_on(state, model=models[side], proxy=proxy, llm=llm,
                                        seed=sample_seed(seed, "continue", state.digest, r),
                                        tags=tags)
                except Exception as e:  # a broken rollout is reported, never fatal
                    failures.append(f"continuation of {state.key} by {models[side]}: "
                                    f"{type(e).__name__}: {e}")
                    return
            wins.setdefault((state.key, side), []).append(1.0 if won else 0.0)  # order-free

        await asyncio.gather(*(one(st, side, r) for st in states for side in models
                               for r in range(rollouts)))
    rows = []
    for st in states:
        a, b = wins.get((st.key, "a")), wins.get((st.key, "b"))
        if a and b:
            rows.append(Continued(st.task_id, sum(a) / len(a), sum(b) / len(b)))
    return rows, failures
