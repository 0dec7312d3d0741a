"""One likelihood run: trajectories from the logs, each action scored, the result."""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from budgetproxy.likelihood.scoring import (
    ActionScore,
    LikelihoodInputError,
    Scorer,
    ScoringError,
)
from budgetproxy.likelihood.stats import (
    StepScore,
    TrajectoryScore,
    length_matched,
    llr_summary,
    match_pairs,
    per_step,
    step_difference,
)
from budgetproxy.probe.states import (
    SIDES,
    Episode,
    ProbeInputError,
    State,
    episode_states,
    matches,
    parse_selector,
    read_episodes,
)

PROBE_HEADER = "X-Budgetproxy-Probe"  # the proxy forwards these calls and counts no turn
FAILURE_EXAMPLES = 5


@dataclass(frozen=True)
class LikelihoodOptions:
    """What to score, under which reference, through which URL (the command's flags)."""

    paths: Sequence[str | Path]
    a: str  # FIELD=VALUE
    b: str
    reference: str
    proxy: str
    length_match: float = 0.1
    seed: int = 0
    resamples: int = 1000
    trajectories: int | None = None  # per policy and task; None: all
    method: str = "auto"  # auto | prompt_logprobs | echo
    own: str = "auto"  # auto | captured | scored: where log π_policy comes from
    models: dict[str, str] = field(default_factory=dict)  # side → model, over the logs'
    api_key: str = "likelihood"
    concurrency: int = 16


@dataclass
class Trajectory:
    """One selected episode: its states (each with the logged action) and captured logprobs."""

    side: str
    episode: Episode
    states: list[State]
    captured: list[list[float] | None]  # per state: the turn's captured logprobs, if any

    @property
    def task_id(self) -> str:
        return str(self.episode.record.get("task_id"))

    @property
    def success(self) -> bool | None:
        rec = self.episode.record
        if rec.get("end_reason") == "abandoned" and rec.get("outcome") is None:
            return None
        return rec.get("outcome") == "success" or rec.get("end_reason") == "success"

    def key(self) -> str:
        """Stable across runs over the same logs: what was done, then the episode id."""
        acts = orjson.dumps([s.action for s in self.states], option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(acts).hexdigest() + str(self.episode.record["episode_id"])


def _captured(turn: Mapping[str, Any]) -> list[float] | None:
    lps = turn.get("logprobs")
    if isinstance(lps, list) and lps and all(isinstance(x, int | float) for x in lps):
        return [float(x) for x in lps]
    return None


def trajectories(episodes: Mapping[str, Episode], selectors: Mapping[str, tuple[str, str]],
                 ) -> tuple[dict[str, list[Trajectory]], dict[str, str]]:
    """Each side's finished episodes with a task id and a scored action, and its model."""
    out: dict[str, list[Trajectory]] = {s: [] for s in SIDES}
    models: dict[str, Counter[str]] = {s: Counter() for s in SIDES}
    for ep in episodes.values():
        rec = ep.record
        if rec.get("task_id") is None or isinstance(rec.get("tags"), dict) and (
                "probe" in rec["tags"]):
            continue
        for side in SIDES:
            if not matches(rec, selectors[side]):
                continue
            states = episode_states(ep, side)
            ok = {int(t.get("turn", 0)): t for t in ep.turns if t.get("status") == "ok"}
            for t in ok.values():
                if isinstance(t.get("model"), str):
                    models[side][t["model"]] += 1
            if states:
                out[side].append(Trajectory(side, ep, states,
                                            [_captured(ok.get(s.turn, {})) for s in states]))
    for side in SIDES:
        if not out[side]:
            sel = selectors[side]
            raise LikelihoodInputError(f"no finished episode with a task_id and an answered "
                                       f"turn has {sel[0]}={sel[1]}")
    return out, {s: models[s].most_common(1)[0][0] for s in SIDES if models[s]}


def sample(trajs: Sequence[Trajectory], per_task: int | None, rng: random.Random,
           ) -> list[Trajectory]:
    """At most `per_task` trajectories of each task, drawn with `rng` in a stable order."""
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in sorted(trajs, key=Trajectory.key):
        groups[t.task_id].append(t)
    out = []
    for task in sorted(groups):
        rows = groups[task]
        out += rows if per_task is None or len(rows) <= per_task else rng.sample(rows, per_task)
    return out


def _action_digest(action: Mapping[str, Any] | None) -> str:
    return hashlib.sha256(orjson.dumps(action, option=orjson.OPT_SORT_KEYS)).hexdigest()


class _Scores:
    """Scoring calls made once per (model, state, action), `concurrency` at a time."""

    def __init__(self, scorer: Scorer, concurrency: int) -> None:
        self.scorer = scorer
        self.gate = asyncio.Semaphore(concurrency)
        self.done: dict[tuple[str, str, str], ActionScore | str] = {}
        self.failures: list[str] = []

    @staticmethod
    def key(model: str, st: State) -> tuple[str, str, str]:
        return (model, st.digest, _action_digest(st.action))

    async def one(self, model: str, st: State) -> None:
        k = self.key(model, st)
        if k in self.done:
            return
        self.done[k] = "pending"
        async with self.gate:
            try:
                self.done[k] = await self.scorer.score(model, st.messages, st.action or {})
            except ScoringError as e:
                self.done[k] = f"{model} on {st.key}: {e}"
                self.failures.append(self.done[k])  # type: ignore[arg-type]

    def get(self, model: str, st: State) -> ActionScore | None:
        got = self.done.get(self.key(model, st))
        return got if isinstance(got, ActionScore) else None


async def _score_all(opts: LikelihoodOptions, jobs: Sequence[tuple[str, State]]) -> _Scores:
    import httpx

    base = opts.proxy.rstrip("/")
    base = base if base.endswith("/v1") else base + "/v1"
    headers = {"Authorization": f"Bearer {opts.api_key}",
               PROBE_HEADER: f"likelihood-{uuid.uuid4().hex[:12]}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=120.0) as client:
        scores = _Scores(Scorer(client, opts.method), opts.concurrency)
        firsts: dict[str, State] = {}
        for model, st in jobs:
            firsts.setdefault(model, st)
        for model, st in firsts.items():  # each model's way of scoring, found once
            try:
                scores.done[_Scores.key(model, st)] = await scores.scorer.score(
                    model, st.messages, st.action or {})
            except ScoringError as e:
                raise LikelihoodInputError(f"--proxy {opts.proxy}: scoring under {model} "
                                           f"failed: {e}") from None
        await asyncio.gather(*(scores.one(m, st) for m, st in jobs))
    return scores


def _own_source(t: Trajectory, own: str) -> str:
    captured = all(c is not None for c in t.captured)
    if own == "captured" and not captured:
        raise LikelihoodInputError(f"--own captured: episode {t.episode.record['episode_id']} "
                                   "has turns without captured logprobs (capture_tokens)")
    return "captured" if captured and own != "scored" else "scored"


async def run_likelihood(opts: LikelihoodOptions) -> dict[str, Any]:
    """The whole view; the result has the `--json` shape of docs/likelihood.md."""
    started = time.monotonic()
    if not 0 <= opts.length_match < 1:
        raise LikelihoodInputError(f"--length-match: expected a share in [0, 1), got "
                                   f"{opts.length_match}")
    try:
        selectors = {"a": parse_selector(opts.a), "b": parse_selector(opts.b)}
        found, logged = trajectories(read_episodes(opts.paths), selectors)
    except ProbeInputError as e:
        raise LikelihoodInputError(str(e)) from None
    if selectors["a"] == selectors["b"]:
        raise LikelihoodInputError("--a and --b select the same episodes")
    models = {**logged, **opts.models}
    rng = random.Random(opts.seed)
    chosen = {s: sample(found[s], opts.trajectories, rng) for s in SIDES}
    sources = {s: {t.episode.record["episode_id"]: _own_source(t, opts.own) for t in chosen[s]}
               for s in SIDES}
    jobs: list[tuple[str, State]] = []
    for side in SIDES:
        for t in chosen[side]:
            scored_own = sources[side][t.episode.record["episode_id"]] == "scored"
            if scored_own and side not in models:
                raise LikelihoodInputError(f"no turn record of {getattr(opts, side)} names a "
                                           f"model; name it with --model-{side}")
            for st in t.states:
                jobs.append((opts.reference, st))
                if scored_own:
                    jobs.append((models[side], st))
    scores = await _score_all(opts, jobs)
    steps, trajs, left_out = [], [], 0
    for side in SIDES:
        for t in chosen[side]:
            eid = t.episode.record["episode_id"]
            ref = [scores.get(opts.reference, st) for st in t.states]
            steps += [StepScore(t.task_id, side, 0.0 - r.logprob, r.tokens) for r in ref
                      if r is not None]
            if any(r is None for r in ref):
                left_out += 1
                continue
            if sources[side][eid] == "captured":
                own: list[float | None] = [sum(c or []) for c in t.captured]
            else:
                got = [scores.get(models[side], st) for st in t.states]
                own = [g.logprob if g is not None else None for g in got]
            ref_lp = sum(r.logprob for r in ref if r is not None)
            llr = None if any(o is None for o in own) else sum(o or 0.0 for o in own) - ref_lp
            trajs.append(TrajectoryScore(t.task_id, side, eid, t.success, 0.0 - ref_lp, llr,
                                         sum(r.tokens for r in ref if r is not None)))
    pairs = match_pairs(trajs, opts.length_match)
    n, seed = opts.resamples, opts.seed
    by_outcome = {f"{side}_{kind}": llr_summary(
        [t for t in trajs if t.side == side and t.success is (kind == "success")], n, seed)
        for side in SIDES for kind in ("success", "failure")}
    counted = Counter(v for s in SIDES for v in sources[s].values())
    return {
        "per_step": {**{side: per_step([s for s in steps if s.side == side], n, seed)
                        for side in SIDES},
                     "diff": step_difference(steps, n, seed)},
        "trajectory_llr": by_outcome,
        "length_matched": length_matched(pairs, opts.length_match, n, seed),
        "settings": {
            "a": opts.a, "b": opts.b, "reference": opts.reference,
            "model_a": models.get("a"), "model_b": models.get("b"), "proxy": opts.proxy,
            "method": opts.method, "methods": dict(scores.scorer.methods),
            "length_match": opts.length_match,
            "seed": seed, "resamples": n, "trajectories_per_task": opts.trajectories,
            "trajectories": {s: len(chosen[s]) for s in SIDES},
            "episodes": {s: len(found[s]) for s in SIDES},
            "steps": len(steps), "own_logprobs": {"captured": counted["captured"],
                                                  "scored": counted["scored"]},
            "scoring_calls": scores.scorer.calls, "scoring_failures": len(scores.failures),
            "trajectories_left_out": left_out,
            "failure_examples": scores.failures[:FAILURE_EXAMPLES],
            "seconds": round(time.monotonic() - started, 3),
        },
    }
