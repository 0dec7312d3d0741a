"""The demo run: start the model and the proxy, play every planned episode, analyse, report.

Everything runs in this process: the simulated model (aiohttp, a thread), the real proxy
(uvicorn, a thread, embedded defaults with a memory store and JSONL trajectories in
OUT/trajectories), and the agents (asyncio, the official ``openai`` client). The results
table and report come from ``budgetproxy analyze`` over the trajectories the proxy wrote.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import io
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from budgetproxy.demo.agents import EpisodePlan, EpisodeResult
from budgetproxy.demo.frozenlake import LAKES, QUICK_TASKS, TASKS, Task

TIERS = (25, 50, 75, 100)
ARMS: tuple[tuple[str, str], ...] = (
    ("careful", "hidden"),
    ("recovering", "hidden"),
    ("budget-aware", "hidden"),
    ("budget-aware", "disclosed"),
)


@dataclass(frozen=True)
class DemoSettings:
    """What to run; the defaults are the full demo."""

    out: Path
    seed: int = 0
    k: int = 8  # episodes per task, tier and arm
    tasks: tuple[Task, ...] = TASKS + LAKES  # enough tasks for intervals over tasks
    arms: tuple[tuple[str, str], ...] = ARMS
    budgetmix_groups: int = 4  # per task, of k_budgetmix episodes each
    k_budgetmix: int = 8
    concurrency: int = 16
    analysis_k: tuple[int, ...] = (1, 2, 4, 8)
    # budgetproxy probe on the run's logs (demo/probe.py): states, samples, continuations
    probe_states: int = 64
    probe_samples: int = 8
    probe_rollouts: int = 2
    # budgetproxy likelihood on the run's logs (demo/likelihood.py): trajectories per map
    likelihood_trajectories: int = 3
    # the token arm (demo/token_arm.py): episodes per task and arm, and the budget's size
    token_k: int = 8
    token_calls_per_cell: float = 1.5
    # the dynamics run (demo/dynamics.py): episodes per map and checkpoint, and its probe
    dynamics_k: int = 4
    dynamics_states: int = 20  # 10 per side: one a map on 10 maps, the few_tasks floor
    dynamics_samples: int = 3
    figure: Path | None = None  # also draw the README's figure here (demo/figure.py)
    # the live experiment (demo/live_experiment.py): episodes whose arm the proxy draws
    experiment_episodes: int = 120

    @classmethod
    def quick(cls, out: Path, seed: int = 0) -> DemoSettings:
        return cls(out=out, seed=seed, k=8, tasks=QUICK_TASKS, budgetmix_groups=2,
                   probe_states=32, probe_samples=4, probe_rollouts=1, experiment_episodes=90,
                   likelihood_trajectories=2, dynamics_states=8, dynamics_samples=2)

    @property
    def budgetmix_tasks(self) -> tuple[Task, ...]:
        """BudgetMix groups run on the fixed maps only: they show the sampler, not an effect."""
        return tuple(t for t in self.tasks if t in TASKS) or self.tasks


@dataclass
class DemoOutcome:
    """What the run left behind."""

    results: list[EpisodeResult] = field(default_factory=list)
    pass_at: list[dict[str, Any]] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)
    probe: dict[str, Any] = field(default_factory=dict)
    likelihood: dict[str, Any] = field(default_factory=dict)
    dynamics: list[EpisodeResult] = field(default_factory=list)  # the checkpoints' episodes
    dynamics_probe: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def tier_turns(percent: int, max_turns: int) -> int:
    from budgetproxy.analysis.passk import tier_to_turns

    return tier_to_turns(percent, max_turns)


def episode_seed(seed: int, *parts: object) -> int:
    """A stable 31-bit seed per episode; shared across policies so they meet the same ice."""
    digest = hashlib.sha256(repr((seed, *parts)).encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


def plan_episodes(s: DemoSettings) -> list[EpisodePlan]:
    """Tier runs (every arm at every tier) and BudgetMix groups, interleaved for the bar."""
    plans: list[EpisodePlan] = []
    for task in s.tasks:
        for tier in TIERS:
            budget = tier_turns(tier, task.max_turns)
            for i in range(s.k):
                seed = episode_seed(s.seed, task.task_id, tier, i)
                plans += [
                    EpisodePlan(task, policy, budget, arm, seed, tier=tier)  # type: ignore[arg-type]
                    for policy, arm in s.arms
                ]
        for g in range(s.budgetmix_groups if task in s.budgetmix_tasks else 0):
            for i in range(s.k_budgetmix):
                seed = episode_seed(s.seed, task.task_id, "budgetmix", g, i)
                plans.append(EpisodePlan(task, "budget-aware", None, "disclosed", seed,
                                         run="budgetmix", group=f"budgetmix-{g}"))
    return plans


class ProgressBar:
    """Episodes done, turns played and time, on stderr: redrawn on a terminal, else in steps."""

    def __init__(self, total: int, stream: TextIO, width: int = 30) -> None:
        self.total, self.stream, self.width = total, stream, width
        self.done = self.turns = 0
        self.started = time.monotonic()
        self.tty = stream.isatty()
        self._drawn = 0.0
        self._step = 0

    def advance(self, turns: int) -> None:
        self.done += 1
        self.turns += turns
        now = time.monotonic()
        if self.tty and (now - self._drawn > 0.1 or self.done == self.total):
            self._drawn = now
            self.stream.write("\r" + self._line())
            self.stream.flush()
        elif not self.tty and 10 * self.done // self.total > self._step:
            self._step = 10 * self.done // self.total
            self.stream.write(self._line() + "\n")
            self.stream.flush()

    def _line(self) -> str:
        filled = self.width * self.done // max(1, self.total)
        bar = "#" * filled + "." * (self.width - filled)
        return (f"[{bar}] {self.done}/{self.total} episodes, {self.turns:,} turns, "
                f"{time.monotonic() - self.started:.0f}s")

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


async def play_all(
    proxy_url: str, plans: Sequence[EpisodePlan], concurrency: int, bar: ProgressBar | None
) -> list[EpisodeResult]:
    """Every plan, at most `concurrency` at a time, through one shared OpenAI client."""
    import openai

    from budgetproxy.client import AsyncBudgetClient
    from budgetproxy.demo.agents import play

    gate = asyncio.Semaphore(concurrency)
    async with (
        AsyncBudgetClient(proxy_url) as proxy,
        openai.AsyncOpenAI(base_url=f"{proxy_url}/v1", api_key="demo", timeout=60) as llm,
    ):

        async def one(plan: EpisodePlan) -> EpisodeResult:
            async with gate:
                result = await play(proxy, llm, plan)
            if bar is not None:
                bar.advance(result.turns)
            return result

        return list(await asyncio.gather(*(one(p) for p in plans)))


def proxy_config(s: DemoSettings, upstream: str, **overrides: Any) -> Any:
    """Embedded defaults plus what the demo needs: its upstream, log dir, BudgetMix, seed."""
    from budgetproxy.config import load_config

    return load_config(None, {
        "upstreams": [{"name": "simulated", "base_url": upstream}],
        "trajectories": {"dir": str(s.out / "trajectories")},
        "store": {"kind": "memory"},
        "budget": {"sampler": "budgetmix", "seed": s.seed},
        "disclosure": {"mode": "hidden"},
    } | overrides)


def _analyze(argv: list[str]) -> tuple[int, str]:
    """Run `budgetproxy analyze` in-process; returns its exit code and what it printed."""
    from budgetproxy.analysis import command as analysis

    parser = argparse.ArgumentParser(prog="budgetproxy")
    analysis.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["analyze", *argv])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = int(args.func(args))
    return code, out.getvalue()


def add_summary_to_report(report: Path, summary: Sequence[str]) -> None:
    """Put the demo's findings at the top of the analysis report."""
    from budgetproxy.demo.summary_page import summary_section

    page = report.read_text(encoding="utf-8")
    section = summary_section(summary)
    at = page.find("<h2>")
    page = page[:at] + section + page[at:] if at >= 0 else page.replace("</body>",
                                                                         section + "</body>")
    report.write_text(page, encoding="utf-8")


def _clear_old_logs(folder: Path) -> int:
    """Remove trajectory logs of an earlier demo in the same folder, so runs don't mix."""
    removed = 0
    for old in [*folder.glob("*.jsonl"), *folder.glob("*.jsonl.gz")]:
        old.unlink()
        removed += 1
    return removed


def _likelihood(s: DemoSettings, traj: Path, upstream: str, err: TextIO) -> dict[str, Any]:
    """The likelihood view on the run's logs, through a proxy of its own on the same model
    (logging apart, under OUT/likelihood)."""
    from budgetproxy.demo.likelihood import run_demo_likelihood

    own = replace(s, out=s.out / "likelihood")
    _clear_old_logs(own.out / "trajectories")
    started = time.monotonic()
    result = run_demo_likelihood(s.out, traj, proxy_config(own, upstream),
                                 per_task=s.likelihood_trajectories, seed=s.seed)
    print(f"likelihood: {time.monotonic() - started:.1f}s", file=err)
    return result


def run_demo(s: DemoSettings, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> DemoOutcome:
    """The whole demo; raises on failure. Writes OUT/{trajectories/,metrics.txt,report.html,
    trajectories-tokens/,trajectories-experiment/,experiment.json,pass_at.json,summary.txt,
    probe.json,probe/,likelihood.json,likelihood/,dynamics.json,trajectories-dynamics/,
    probe-dynamics/}."""
    from budgetproxy.client import BudgetClient
    from budgetproxy.demo import dynamics, live_experiment, token_arm
    from budgetproxy.demo import likelihood as demo_likelihood
    from budgetproxy.demo.model_server import ModelServer
    from budgetproxy.demo.probe import add_to_report, claims, run_demo_probe
    from budgetproxy.demo.summary import (
        BY,
        COMPARE,
        refusal_breakdown,
        token_claim,
        what_this_shows,
    )
    from budgetproxy.serve.server import ProxyServer

    started = time.monotonic()
    if s.figure is not None:  # no Chromium: fail now, not after the run
        from budgetproxy.demo.figure import chromium

        chromium()
    traj = s.out / "trajectories"
    traj.mkdir(parents=True, exist_ok=True)
    if removed := _clear_old_logs(traj):
        print(f"removed {removed} trajectory file(s) of an earlier run in {traj}", file=err)
    plans = plan_episodes(s)
    token_plans = token_arm.plan_token_episodes(
        s.tasks, s.token_k, s.token_calls_per_cell, lambda *p: episode_seed(s.seed, *p))
    _clear_old_logs(s.out / token_arm.LOGS)
    experiment_plans = live_experiment.plan_experiment_episodes(
        s.experiment_episodes, tier_turns(live_experiment.TIER, live_experiment.TASK.max_turns),
        lambda *p: episode_seed(s.seed, *p))
    _clear_old_logs(s.out / live_experiment.LOGS)
    dynamics_plans = dynamics.plan_checkpoint_episodes(
        s.tasks, s.dynamics_k, lambda *p: episode_seed(s.seed, *p))
    _clear_old_logs(s.out / dynamics.LOGS)
    outcome = DemoOutcome()
    with ModelServer(seed=s.seed) as model:
        with ProxyServer(proxy_config(s, model.base_url)) as proxy:
            total = (len(plans) + len(token_plans) + len(experiment_plans)
                     + len(dynamics_plans))
            print(f"proxy on {proxy.url}, simulated model on {model.base_url}; "
                  f"{total} episodes on {len(s.tasks)} FrozenLake maps", file=err)
            bar = ProgressBar(total, err)
            try:
                outcome.results = asyncio.run(play_all(proxy.url, plans, s.concurrency, bar))
                # The token arm tells the agent its tokens: a proxy of its own, its template.
                with ProxyServer(proxy_config(s, model.base_url,
                                              **token_arm.proxy_overrides(s.out))) as tokens:
                    outcome.results += asyncio.run(
                        play_all(tokens.url, token_plans, s.concurrency, bar))
                # The live experiment: its proxy draws each episode's arm.
                with ProxyServer(proxy_config(s, model.base_url,
                                              **live_experiment.proxy_overrides(s.out))) as lx:
                    outcome.results += asyncio.run(
                        play_all(lx.url, experiment_plans, s.concurrency, bar))
                # The checkpoints log apart too: they are not the tiers' policies.
                with ProxyServer(proxy_config(s, model.base_url,
                                              **dynamics.proxy_overrides(s.out))) as steps:
                    outcome.dynamics = asyncio.run(
                        play_all(steps.url, dynamics_plans, s.concurrency, bar))
            finally:
                bar.close()
            with BudgetClient(proxy.url) as api:
                metrics = api.metrics()
        # The proxy has stopped: every trajectory record is on disk. The probe gets a proxy
        # of its own on the same model, logging apart (OUT/probe/trajectories).
        probe_out = replace(s, out=s.out / "probe")
        _clear_old_logs(probe_out.out / "trajectories")
        probe_started = time.monotonic()
        outcome.probe = run_demo_probe(
            s.out, traj, proxy_config(probe_out, model.base_url), states=s.probe_states,
            samples=s.probe_samples, rollouts=s.probe_rollouts, seed=s.seed)
        print(f"probe: {time.monotonic() - probe_started:.1f}s", file=err)
        outcome.likelihood = _likelihood(s, traj, model.base_url, err)
        dynamics_out = replace(s, out=s.out / "probe-dynamics")
        _clear_old_logs(dynamics_out.out / "trajectories")
        probe_started = time.monotonic()
        with ProxyServer(proxy_config(dynamics_out, model.base_url)) as probing:
            outcome.dynamics_probe = dynamics.run_probe_over(
                s.out / dynamics.LOGS, probing.url, states=s.dynamics_states,
                samples=s.dynamics_samples, seed=s.seed)
        print(f"probe per checkpoint: {time.monotonic() - probe_started:.1f}s", file=err)
    (s.out / "metrics.txt").write_text(metrics, encoding="utf-8")
    ks = ",".join(map(str, s.analysis_k))
    report = s.out / "report.html"
    common = [str(traj), "--k", ks, "--by", ",".join(BY), "--seed", str(s.seed)]
    for pair in COMPARE:
        common += ["--compare", pair]
    code, table = _analyze([*common, "--report", str(report), "--view", str(s.out / "episodes")])
    if code not in (0, 1):
        raise RuntimeError(f"budgetproxy analyze failed (exit {code})")
    table = table.split("Paired differences", 1)[0].rstrip() + "\n"  # the claims cite them
    code, as_json = _analyze([*common, "--json"])
    analysis = json.loads(as_json)
    outcome.pass_at = list(analysis.get("pass_at", []))
    outcome.summary = what_this_shows(analysis.get("compare", []), outcome.results, s.analysis_k)
    code, token_json = _analyze([*token_arm.analyze_args(s.out, ks, s.seed), "--json"])
    if code not in (0, 1):
        raise RuntimeError(f"budgetproxy analyze of the token arm failed (exit {code})")
    token_analysis = json.loads(token_json)
    outcome.summary += token_claim(token_analysis.get("compare", []), outcome.results)
    analysis["token_arm"] = token_analysis
    experiment_view, experiment_lines = live_experiment.stopping_points(
        s.out / live_experiment.LOGS)
    (s.out / "experiment.json").write_text(json.dumps(experiment_view, indent=2) + "\n",
                                           encoding="utf-8")
    outcome.summary += ["", *experiment_lines]
    as_json = json.dumps(analysis, indent=2, ensure_ascii=False)
    code, dynamics_json = _analyze([*dynamics.analyze_args(s.out, s.seed), "--json"])
    if code not in (0, 1):
        raise RuntimeError(f"budgetproxy analyze of the checkpoints failed (exit {code})")
    dynamics_analysis = json.loads(dynamics_json)
    dynamics.write(s.out, dynamics_analysis, outcome.dynamics_probe)
    add_summary_to_report(report, outcome.summary)
    add_to_report(report, outcome.probe)
    demo_likelihood.add_to_report(report, outcome.likelihood)
    dynamics.add_to_report(report, outcome.dynamics_probe)
    (s.out / "pass_at.json").write_text(as_json, encoding="utf-8")
    (s.out / "summary.txt").write_text("\n".join(outcome.summary) + "\n", encoding="utf-8")
    outcome.seconds = time.monotonic() - started
    print(table, file=out)
    print("\n".join(outcome.summary), file=out)
    print("\n" + "\n".join(claims(outcome.probe)), file=out)
    print("\n" + "\n".join(demo_likelihood.claims(outcome.likelihood)), file=out)
    print("\n" + "\n".join(dynamics.claims(dynamics_analysis, outcome.dynamics_probe)),
          file=out)
    turns = sum(r.turns for r in outcome.results)
    # Every run's refusals, where "Enforcement" above counts the tier runs' alone.
    print(f"\n{len(outcome.results)} episodes, {turns:,} turns answered and "
          f"{refusal_breakdown(outcome.results)} refused for a spent budget, and "
          f"{len(outcome.dynamics)} checkpoint episodes "
          f"({sum(r.turns for r in outcome.dynamics):,} turns), in "
          f"{outcome.seconds:.0f}s. Left in {s.out}:", file=out)
    for name, what in (("report.html", "the HTML report"),
                       ("episodes/", "a page per episode, linked from the report's tasks "
                                     "(budgetproxy view)"),
                       ("trajectories/", "the proxy's JSONL trajectories"),
                       ("trajectories-tokens/", "the token arm's trajectories"),
                       ("trajectories-experiment/", "the live experiment's trajectories"),
                       ("experiment.json", "the live experiment's state at the end "
                                           "(analyze --experiment)"),
                       ("metrics.txt", "a /metrics snapshot (Prometheus text)"),
                       ("pass_at.json", "the Pass@(K,T) cells and paired differences "
                                        "(analyze --json)"),
                       ("summary.txt", "what this shows"),
                       ("probe.json", "budgetproxy probe: careful vs recovering, same states"),
                       ("probe/", "the probe's calls and continuation episodes (JSONL)"),
                       ("likelihood.json", "budgetproxy likelihood: both policies' actions "
                                           "scored under careful"),
                       ("likelihood/", "the likelihood view's scoring calls (JSONL)"),
                       ("dynamics.json", "the checkpoints: analyze --over step --ceiling and "
                                         "probe --over step"),
                       ("trajectories-dynamics/", "the checkpoints' trajectories"),
                       ("probe-dynamics/", "the probe per checkpoint's calls (JSONL)")):
        print(f"  {s.out / name}  {what}", file=out)
    print(f"Re-run the analysis: budgetproxy analyze {traj} --by {','.join(BY)} "
          + " ".join(f"--compare {c}" for c in COMPARE), file=out)
    print("  and of the token arm: budgetproxy analyze "
          + " ".join(token_arm.analyze_args(s.out, ks, s.seed)), file=out)
    print(f"  and of the live experiment: budgetproxy analyze {s.out / live_experiment.LOGS} "
          f"--experiment {live_experiment.NAME}", file=out)
    print("  and of the checkpoints: budgetproxy analyze "
          + " ".join(dynamics.analyze_args(s.out, s.seed)), file=out)
    print(f"Look at one episode, turn by turn: budgetproxy view {traj} --serve", file=out)
    if s.figure is not None:  # last: the results are printed whatever happens here
        from budgetproxy.demo.figure import write_figure

        out.flush()
        data = write_figure(analysis, s.figure)
        print(f"figure: {s.figure} (drawn from {data})", file=err)
    return outcome
