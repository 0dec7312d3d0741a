"""`budgetproxy probe`: compare two policies' next actions from the same logged states."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

DESCRIPTION = """\
From trajectory logs (content: full), sample matched states - conversation prefixes taken in
equal numbers from A's and B's own trajectories, task by task - and from each state sample G
next actions from each policy through a running proxy (--proxy; probe calls spend no budget
and are logged as probe records). A scorer (module:function(state, action) -> float) values
each action. Prints the single-step win rate of A over B (ties apart), the same after errors
(--inject, or states already holding one), and with --continue the terminal success of each
policy played on from the same states; each with a 95% bootstrap CI over tasks.
Exit 0, or 2 on bad input."""


def positive(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `probe` subcommand; its handler is `run`."""
    p = subparsers.add_parser("probe", help="compare two policies step by step from the same "
                              "logged states", description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="PATH", help="trajectory JSONL files or folders")
    p.add_argument("--a", metavar="FIELD=VALUE",
                   help="policy A's episodes: an episode field or tag (model=X, policy=Y); "
                   "with --over, optional: narrows the checkpoints' episodes")
    p.add_argument("--b", required=True, metavar="FIELD=VALUE",
                   help="policy B's episodes; with --over, the fixed reference")
    p.add_argument("--over", metavar="FIELD",
                   help="training dynamics: split A by this field or tag (step, model) and "
                   "compare each checkpoint with the reference --b, in checkpoint order")
    p.add_argument("--scorer", required=True, metavar="frozenlake|command|MODULE:FUNC",
                   help="values an action: MODULE:FUNC(state, action) -> float")
    p.add_argument("--command", metavar="CMD", help="for --scorer command: run once per action "
                   "(state and action as JSON on stdin)")
    p.add_argument("--scorer-timeout", type=float, default=60.0, metavar="S",
                   help="for --scorer command: seconds per action (default 60)")
    p.add_argument("--states", type=positive, default=64, metavar="N",
                   help="states to compare, half from each policy's trajectories (default 64)")
    p.add_argument("--samples", type=positive, default=16, metavar="G",
                   help="next actions per state and policy (default 16)")
    p.add_argument("--inject", choices=("tool-error", "action"),
                   help="also compare from error states made from the sampled ones")
    p.add_argument("--error-pattern", metavar="REGEX", help="states whose last action led to "
                   "text matching this already hold an error (default: the scorer's)")
    p.add_argument("--tool-error", metavar="TEXT", help="--inject tool-error's text ({name} "
                   "is the tool); default: errors seen in the logs, else a generic one")
    p.add_argument("--continue", dest="continue_", action="store_true",
                   help="play each policy on to the end from the same (error) states")
    p.add_argument("--rollouts", type=positive, default=4, metavar="R",
                   help="continuations per state and policy (default 4)")
    p.add_argument("--proxy", default="http://127.0.0.1:8080", metavar="URL",
                   help="the running proxy's root URL (default http://127.0.0.1:8080)")
    p.add_argument("--api-key", default="probe", help="API key for the proxy")
    p.add_argument("--tools", type=Path, metavar="FILE.json",
                   help="tool definitions to send with each state (the logs do not hold them)")
    p.add_argument("--placement", choices=("last_message", "system", "new_message"),
                   default="last_message", help="the disclosure.placement of the proxy that "
                   "wrote the logs: disclosed states are rebuilt with the texts where it put "
                   "them (default last_message)")
    p.add_argument("--model-a", help="model to sample for A (default: the one in A's logs)")
    p.add_argument("--model-b", help="model to sample for B")
    p.add_argument("--concurrency", type=positive, default=16, help="calls at once (16)")
    p.add_argument("--seed", type=int, default=0, help="sampling and bootstrap seed (0)")
    p.add_argument("--resamples", type=positive, default=1000, help="bootstrap resamples")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--report", type=Path, metavar="FILE.html", help="write an HTML report")
    p.set_defaults(func=run)


def options_from(args: argparse.Namespace) -> Any:
    """The parsed flags as ProbeOptions (raises ScorerError / ProbeInputError on bad input)."""
    from budgetproxy.probe.run import ProbeOptions
    from budgetproxy.probe.scorers import load_scorer
    from budgetproxy.probe.states import ProbeInputError

    tools = None
    if args.tools is not None:
        try:
            tools = json.loads(args.tools.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ProbeInputError(f"--tools: cannot read {args.tools}: {e}") from None
        if not isinstance(tools, list):
            raise ProbeInputError("--tools: expected a JSON list of tool definitions")
    models = {s: m for s, m in (("a", args.model_a), ("b", args.model_b)) if m}
    return ProbeOptions(
        paths=args.paths, a=args.a or "", b=args.b,
        scorer=load_scorer(args.scorer, args.command, args.scorer_timeout), proxy=args.proxy,
        states=args.states, samples=args.samples, inject=args.inject,
        error_pattern=args.error_pattern, tool_error=args.tool_error, continue_=args.continue_,
        rollouts=args.rollouts, seed=args.seed, resamples=args.resamples, api_key=args.api_key,
        tools=tools, concurrency=args.concurrency, models=models, placement=args.placement)


def run(args: argparse.Namespace) -> int:
    """Run the probe; 0 on success, 2 on bad input or when no proxy answers."""
    import importlib.util
    import re

    missing = [n for n in ("openai", "httpx") if importlib.util.find_spec(n) is None]
    if missing:
        print(f"budgetproxy probe: missing {', '.join(missing)}: pip install {' '.join(missing)}"
              " (or the [demo] extra)", file=sys.stderr)
        return 2

    from budgetproxy.probe.report import format_text, html_page
    from budgetproxy.probe.run import run_probe
    from budgetproxy.probe.scorers import ScorerError
    from budgetproxy.probe.states import ProbeInputError

    if args.over is None and args.a is None:
        print("budgetproxy probe: --a is required (or --over FIELD)", file=sys.stderr)
        return 2
    if args.over is not None and args.model_a is not None:
        print("budgetproxy probe: --over samples each checkpoint's own model: drop --model-a",
              file=sys.stderr)
        return 2
    try:
        if args.over is not None:
            from budgetproxy.probe.over import format_over, html_over, run_probe_over

            result = asyncio.run(run_probe_over(options_from(args), args.over.strip(), args.a))
        else:
            result = asyncio.run(run_probe(options_from(args)))
    except (ProbeInputError, ScorerError, re.error) as e:
        print(f"budgetproxy probe: {e}", file=sys.stderr)
        return 2
    if args.over is not None:
        if args.report is not None:
            args.report.write_text(html_page(result, html_over(result)), encoding="utf-8")
        print(json.dumps(result, indent=2) if args.json else format_over(result))
        return 0
    if args.report is not None:
        args.report.write_text(html_page(result), encoding="utf-8")
    print(json.dumps(result, indent=2) if args.json else format_text(result))
    return 0
