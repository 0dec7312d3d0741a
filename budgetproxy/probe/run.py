"""One probe run: states from the logs, actions through the proxy, scores, and the result."""

from __future__ import annotations

import asyncio
import math
import random
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from budgetproxy.probe.inject import (
    corrected,
    inject_tool_error,
    matched_injections,
    observed_errors,
)
from budgetproxy.probe.sampling import Sampled, sample_actions
from budgetproxy.probe.scorers import Scorer
from budgetproxy.probe.states import (
    Episode,
    ProbeInputError,
    State,
    matched_sample,
    parse_selector,
    read_episodes,
    select,
    split_pools,
)
from budgetproxy.probe.stats import Compared, summarize, summarize_continuation

FAILURE_EXAMPLES = 5


@dataclass(frozen=True)
class ProbeOptions:
    """What to compare, from where, and how (the `probe` command's flags)."""

    paths: Sequence[str | Path]
    a: str  # FIELD=VALUE
    b: str
    scorer: Scorer
    proxy: str
    states: int = 64
    samples: int = 16
    inject: str | None = None  # "tool-error" | "action"
    error_pattern: str | None = None
    tool_error: str | None = None  # a template for injected tool errors
    continue_: bool = False
    rollouts: int = 4
    seed: int = 0
    resamples: int = 1000
    api_key: str = "probe"
    tools: list[Any] | None = None
    concurrency: int = 16
    models: dict[str, str] = field(default_factory=dict)  # side → model, over the logs' own
    placement: str = "last_message"  # the proxy's disclosure.placement when the logs were made


@dataclass
class _Scored:
    values: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    fixed: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def _score_all(scorer: Scorer, states: Sequence[State], sampled: Sampled) -> _Scored:
    out = _Scored()
    jobs = [(st, side, action) for st in states for side in ("a", "b")
            for action in sampled.actions.get((st.key, side), [])]

    def one(job: tuple[State, str, dict[str, Any]]) -> float | str:
        st, _, action = job
        try:
            value = float(scorer.score(st, action))
        except Exception as e:  # a scorer's failure is reported, never fatal
            return f"{type(e).__name__}: {e}"
        return value if math.isfinite(value) else f"not a finite score: {value}"

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(one, jobs))
    for (st, side, action), value in zip(jobs, results, strict=True):
        if isinstance(value, str):
            out.failures.append(f"{st.key} ({side}): {value}")
            continue
        out.values.setdefault((st.key, side), []).append(value)
        fix = corrected(st, action)
        if fix is not None:
            out.fixed.setdefault((st.key, side), []).append(1.0 if fix else 0.0)
    return out


def _mean(v: Sequence[float] | None) -> float | None:
    return sum(v) / len(v) if v else None


def _compared(states: Sequence[State], scored: _Scored) -> tuple[list[Compared], int]:
    rows, left_out = [], 0
    for st in states:
        a, b = scored.values.get((st.key, "a")), scored.values.get((st.key, "b"))
        if not a or not b:
            left_out += 1
            continue
        rows.append(Compared(st.task_id, st.fraction, sum(a) / len(a), sum(b) / len(b),
                             _mean(scored.fixed.get((st.key, "a"))),
                             _mean(scored.fixed.get((st.key, "b")))))
    return rows, left_out


def error_states(opts: ProbeOptions, plain: list[State],
                 pools: Mapping[str, Mapping[str, Sequence[State]]], natural: list[State],
                 pattern: re.Pattern[str] | None, rng: random.Random,
                 ) -> tuple[list[State], dict[str, int]]:
    """The states already holding an error, and (as --inject asks) errors put into states of
    `plain`'s tasks, as many from each policy per task (`inject.matched_injections`); with
    how many states tried could take none and how many had no counterpart."""
    counts = {"not_injectable": 0, "injected_unmatched": 0}
    if opts.inject is None:
        return list(natural), counts
    if opts.inject == "action" and opts.scorer.inject_action is None:
        raise ProbeInputError(f"--inject action: scorer {opts.scorer.name} has no inject_action")
    seen = observed_errors(plain + natural, pattern)

    def inject(st: State) -> State | None:
        if opts.inject == "action":
            assert opts.scorer.inject_action is not None
            return opts.scorer.inject_action(st, rng)
        if opts.tool_error is not None:
            return inject_tool_error(st, rng, template=opts.tool_error)
        return inject_tool_error(st, rng, errors=seen)

    injected, counts["not_injectable"], counts["injected_unmatched"] = matched_injections(
        plain, pools, inject, rng)
    return [*natural, *injected], counts


def _check_proxy(url: str) -> None:
    """Fail early, in one line, when no proxy answers at `url`."""
    import httpx

    try:
        httpx.get(f"{url.rstrip('/')}/healthz", timeout=10).raise_for_status()
    except httpx.HTTPError as e:
        raise ProbeInputError(f"--proxy: no proxy answers at {url} ({e})") from None


async def run_probe(
    opts: ProbeOptions, episodes: Mapping[str, Episode] | None = None
) -> dict[str, Any]:
    """The whole probe; the result has the `--json` shape of docs/probe.md (and more).
    `episodes`: the logs already read (else read from `opts.paths`)."""
    started = time.monotonic()
    sel_a, sel_b = parse_selector(opts.a), parse_selector(opts.b)
    selection = select(read_episodes(opts.paths) if episodes is None else episodes, sel_a,
                       sel_b, opts.placement)
    models = {**selection.models, **opts.models}
    for side, sel in (("a", opts.a), ("b", opts.b)):
        if side not in models:
            raise ProbeInputError(f"no turn record of {sel} names a model")
    pattern_text = opts.error_pattern or opts.scorer.error_pattern
    pattern = re.compile(pattern_text) if pattern_text else None
    rng = random.Random(opts.seed)
    plain_pools, error_pools = split_pools(selection.states, pattern)
    plain = matched_sample(plain_pools, opts.states, rng)
    natural = matched_sample(error_pools, opts.states, rng) if pattern is not None else []
    errors, injection = error_states(opts, plain, plain_pools, natural, pattern, rng)
    if opts.continue_ and opts.scorer.continue_episode is None:
        raise ProbeInputError(f"--continue: scorer {opts.scorer.name} has no continue_episode")
    if not plain:
        raise ProbeInputError("no task has states of both A and B to compare")
    _check_proxy(opts.proxy)
    probe_id = f"probe-{uuid.uuid4().hex[:12]}"
    sampled = await sample_actions(
        opts.proxy, plain + errors, models, opts.samples, seed=opts.seed, probe_id=probe_id,
        api_key=opts.api_key, tools=opts.tools, concurrency=opts.concurrency)
    if sampled.failures and not sampled.actions:
        raise ProbeInputError(f"every probe call failed, e.g. {sampled.failures[0]}")
    scored = await asyncio.to_thread(_score_all, opts.scorer, plain + errors, sampled)
    single, left_a = _compared(plain, scored)
    after, left_b = _compared(errors, scored)
    continuation = None
    cont_failures: list[str] = []
    if opts.continue_:
        from budgetproxy.probe.continuation import run_continuations

        assert opts.scorer.continue_episode is not None
        rows, cont_failures = await run_continuations(
            opts.proxy, errors or plain, models, opts.scorer.continue_episode,
            rollouts=opts.rollouts, seed=opts.seed, probe_id=probe_id, api_key=opts.api_key,
            concurrency=opts.concurrency)
        continuation = summarize_continuation(rows, opts.resamples, opts.seed)
    failures = [*sampled.failures, *scored.failures, *cont_failures]
    return {
        "single_step": summarize(single, opts.resamples, opts.seed),
        "error_states": summarize(after, opts.resamples, opts.seed),
        "continuation": continuation,
        "settings": {
            "a": opts.a, "b": opts.b, "model_a": models["a"], "model_b": models["b"],
            "scorer": opts.scorer.name, "states": opts.states, "samples": opts.samples,
            "placement": opts.placement,
            "inject": opts.inject, "error_pattern": pattern_text, "continue": opts.continue_,
            "rollouts": opts.rollouts if opts.continue_ else None, "seed": opts.seed,
            "resamples": opts.resamples, "proxy": opts.proxy, "probe_id": probe_id,
            "episodes": selection.episodes, "sampled_states": len(plain),
            "natural_error_states": len(natural), **injection,
            "injected_states": len(errors) - len(natural),
            "probe_calls": sampled.calls, "sampling_failures": len(sampled.failures),
            "scorer_failures": len(scored.failures),
            "continuation_failures": len(cont_failures),
            "states_left_out": left_a + left_b,
            "failure_examples": failures[:FAILURE_EXAMPLES],
            "seconds": round(time.monotonic() - started, 3),
        },
        "states": [{**st.origin(), "a_mean": _mean(scored.values.get((st.key, "a"))),
                    "b_mean": _mean(scored.values.get((st.key, "b")))}
                   for st in plain + errors],
    }
