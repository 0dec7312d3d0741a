"""`budgetproxy likelihood`: two policies' logged actions scored under a reference model."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from budgetproxy.probe.command import positive

DESCRIPTION = """\
From trajectory logs (content: full), score every logged action of policy A's and B's
episodes (--a/--b FIELD=VALUE) under a reference model through a running proxy or an
OpenAI-compatible server (--proxy): vLLM's prompt_logprobs on chat completions, or echo with
logprobs on text completions. Prints the per-step NLL of each policy's actions under the
reference, the log-likelihood ratio log pi_policy(tau)/pi_ref(tau) per trajectory split by
success (pi_policy from logprobs captured with capture_tokens, else scored under the policy's
own model), and a length-matched comparison of A's and B's trajectories; each with a 95%
bootstrap CI over tasks. Exit 0, or 2 on bad input or an upstream that cannot score."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `likelihood` subcommand; its handler is `run`."""
    p = subparsers.add_parser("likelihood", help="score two policies' logged actions under a "
                              "reference model", description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="PATH", help="trajectory JSONL files or folders")
    p.add_argument("--a", required=True, metavar="FIELD=VALUE",
                   help="policy A's episodes: an episode field or tag (model=X, policy=Y)")
    p.add_argument("--b", required=True, metavar="FIELD=VALUE", help="policy B's episodes")
    p.add_argument("--reference", required=True, metavar="MODEL",
                   help="the model to score every action under")
    p.add_argument("--proxy", default="http://127.0.0.1:8080", metavar="URL",
                   help="a running proxy's root URL, or an OpenAI-compatible base URL "
                   "(default http://127.0.0.1:8080)")
    p.add_argument("--length-match", type=float, default=0.1, metavar="SHARE",
                   help="pair A and B trajectories whose output tokens differ by at most this "
                   "share of the longer (default 0.1)")
    p.add_argument("--method", choices=("auto", "prompt_logprobs", "echo"), default="auto",
                   help="how to score (default auto: prompt_logprobs, else echo)")
    p.add_argument("--own", choices=("auto", "captured", "scored"), default="auto",
                   help="log pi_policy from captured logprobs or by scoring under the "
                   "policy's model (default auto: captured where every turn has them)")
    p.add_argument("--trajectories", type=positive, metavar="N",
                   help="at most N trajectories per policy and task (default all)")
    p.add_argument("--model-a", help="A's model, when scoring its own logprobs (default: the "
                   "one in A's logs)")
    p.add_argument("--model-b", help="B's model")
    p.add_argument("--api-key", default="likelihood", help="API key for the proxy")
    p.add_argument("--concurrency", type=positive, default=16, help="calls at once (16)")
    p.add_argument("--seed", type=int, default=0, help="sampling and bootstrap seed (0)")
    p.add_argument("--resamples", type=positive, default=1000, help="bootstrap resamples")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--report", type=Path, metavar="FILE.html", help="write an HTML report")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the view; 0 on success, 2 on bad input or an upstream that cannot score."""
    import importlib.util

    if importlib.util.find_spec("httpx") is None:
        print("budgetproxy likelihood: missing httpx: pip install httpx (or the [client] "
              "extra)", file=sys.stderr)
        return 2
    from budgetproxy.likelihood.report import format_text, html_page
    from budgetproxy.likelihood.run import LikelihoodOptions, run_likelihood
    from budgetproxy.likelihood.scoring import LikelihoodInputError

    models = {s: m for s, m in (("a", args.model_a), ("b", args.model_b)) if m}
    opts = LikelihoodOptions(
        paths=args.paths, a=args.a, b=args.b, reference=args.reference, proxy=args.proxy,
        length_match=args.length_match, seed=args.seed, resamples=args.resamples,
        trajectories=args.trajectories, method=args.method, own=args.own, models=models,
        api_key=args.api_key, concurrency=args.concurrency)
    try:
        result = asyncio.run(run_likelihood(opts))
    except LikelihoodInputError as e:
        print(f"budgetproxy likelihood: {e}", file=sys.stderr)
        return 2
    if args.report is not None:
        args.report.write_text(html_page(result), encoding="utf-8")
    print(json.dumps(result, indent=2) if args.json else format_text(result))
    return 0
