"""The demo's likelihood view: careful's and recovering's actions scored under careful.

``budgetproxy likelihood`` runs on the demo's own tier trajectories, with the careful policy
as the reference (the study scores the RL policy's actions under the base policy). The demo's
simulated model answers the scoring calls with each policy's exact probability of a reply
(``demo/policy_likelihood.py``), through a proxy of its own logging to
``OUT/likelihood/trajectories``. The claims printed are read from the result: an effect is
named only where its interval excludes zero over at least FEW_TASKS maps.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from budgetproxy.analysis.stats import FEW_TASKS

A, B = "careful", "recovering"
REFERENCE = "sim-careful"
LIKELIHOOD_FILE = "likelihood.json"


def run_demo_likelihood(out: Path, traj: Path, proxy_config: Any, *, per_task: int,
                        seed: int) -> dict[str, Any]:
    """Start a proxy with `proxy_config`, run the view on the demo's logs through it (at most
    `per_task` trajectories per policy and map), write OUT/likelihood.json, return it."""
    from budgetproxy.likelihood import LikelihoodOptions, run_likelihood
    from budgetproxy.serve.server import ProxyServer

    with ProxyServer(proxy_config) as proxy:
        result = asyncio.run(run_likelihood(LikelihoodOptions(
            paths=[traj], a=f"policy={A}", b=f"policy={B}", reference=REFERENCE,
            proxy=proxy.url, trajectories=per_task, seed=seed, method="prompt_logprobs")))
    (out / LIKELIHOOD_FILE).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def _ci(v: Mapping[str, Any], signed: bool = True) -> str:
    if v.get("ci_low") is None:
        return "no interval"
    f = "+.2f" if signed else ".2f"
    return f"95% CI {float(v['ci_low']):{f}} to {float(v['ci_high']):{f}}"


def _verdict(value: float | None, lo: float | None, hi: float | None, few: bool,
             n_tasks: int, above: str, below: str) -> str:
    if value is None or lo is None or hi is None:
        return "nothing to compare"
    if few:
        return f"{n_tasks} maps: fewer than {FEW_TASKS}, too few to name a difference"
    if lo > 0:
        return above
    if hi < 0:
        return below
    return "the interval includes no difference"


def claims(result: Mapping[str, Any]) -> list[str]:
    """The view's findings, each with its interval."""
    step, llr, lm = result["per_step"], result["trajectory_llr"], result["length_matched"]
    a, b, d = step["a"], step["b"], step["diff"]
    lines = [f"Likelihood view (budgetproxy likelihood, actions scored under {REFERENCE}, "
             "bootstrap CIs over maps):"]
    if not a.get("n") or not b.get("n"):
        return [*lines, "- no actions were scored."]
    verdict = _verdict(d.get("nll_diff"), d.get("ci_low"), d.get("ci_high"),
                       bool(d.get("few_tasks")), int(d.get("n_tasks", 0)),
                       f"{B}'s actions are the likelier under {A}",
                       f"{A}'s own actions are the likelier under {A}")
    lines.append(
        f"- Per-step NLL under {A}: {A}'s actions {a['nll_mean']:.2f} nats ({_ci(a, False)}, "
        f"{a['n']} actions), {B}'s {b['nll_mean']:.2f} ({_ci(b, False)}, {b['n']}); {A} − {B} "
        f"{d['nll_diff']:+.2f} ({_ci(d)}): {verdict}.")
    for side, name in (("b", B), ("a", A)):
        v = llr[f"{side}_success"]
        if v.get("n"):
            same = " — the reference itself" if name == A else ""
            lines.append(f"- Successful {name} trajectories: log π_{name}(τ)/π_{A}(τ) = "
                         f"{v['llr_mean']:+.1f} nats{same} ({_ci(v)}, {v['n']} trajectories"
                         + (f"; {v['n_tasks']} maps, too few to lean on" if v.get("few_tasks")
                            else "") + ").")
    if lm.get("n_pairs"):
        verdict = _verdict(lm["diff_nats"], lm["ci_low"], lm["ci_high"],
                           bool(lm.get("few_tasks")), int(lm["n_tasks"]),
                           f"{A}'s trajectories stray further from {A} than {B}'s from {A}",
                           f"{B}'s trajectories stray further from {A} at the same length")
        lines.append(
            f"- Length-matched ({lm['n_pairs']} pairs of the same map within "
            f"{100 * lm['tolerance']:.0f}% in tokens): trajectory LLR {A} − {B} "
            f"{lm['diff_nats']:+.1f} nats ({_ci(lm)}): {verdict}.")
    else:
        lines.append("- Length-matched: no pair of trajectories within the tolerance.")
    return lines


def add_to_report(report: Path, result: Mapping[str, Any]) -> None:
    """The view's section, appended to the demo's HTML report."""
    from budgetproxy.demo.probe import append_section
    from budgetproxy.likelihood.report import html_section

    append_section(report, html_section(result))
