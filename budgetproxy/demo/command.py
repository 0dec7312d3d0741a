"""`budgetproxy demo`: the end-to-end demonstration on FrozenLake with simulated policies."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DESCRIPTION = """\
Start the proxy in-process with embedded defaults, a simulated OpenAI-compatible model and
FrozenLake agents (gymnasium) that call it through the official openai client; run K
episodes per map at the 25/50/75/100% budget tiers in hidden and disclosed arms, plus
BudgetMix groups; print the Pass@(K,T) table and what it shows; run budgetproxy probe on
the logs (careful vs recovering from the same states) and budgetproxy likelihood (both
policies' actions scored under careful) and print their claims; leave report.html (its tasks
linked to a page per episode in episodes/), probe.json, likelihood.json, the trajectories and
a metrics snapshot in --out. Needs the [demo] extra."""


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `demo` subcommand; its handler is `run`."""
    p = subparsers.add_parser(
        "demo",
        help="run the end-to-end demonstration (FrozenLake, simulated policies)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, default=Path("budgetproxy-demo"), metavar="DIR",
                   help="where to leave the report, trajectories and metrics "
                   "(default ./budgetproxy-demo)")
    p.add_argument("--quick", action="store_true",
                   help="two small maps, K=8: about half a minute (for CI)")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds the maps' ice, the policies' sampling and BudgetMix (default 0)")
    p.add_argument("--k", type=_positive, metavar="K",
                   help="episodes per map, tier and arm (default 8)")
    p.add_argument("--concurrency", type=_positive, default=16,
                   help="episodes played at once (default 16)")
    p.add_argument("--figure", type=Path, metavar="FILE.png",
                   help="also draw the report's Pass@(1,T) and Pass@(8,T) charts into FILE.png "
                   "(headless Chromium) and the data they are drawn from into FILE.json; the "
                   "README's figure is the full run's")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo; 0 on success, 1 when it failed, 2 when the [demo] extra is missing or
    --figure is given without Chromium."""
    missing = [name for name in ("gymnasium", "openai", "httpx", "duckdb", "numpy")
               if not _importable(name)]
    if missing:
        print(f"budgetproxy demo: missing {', '.join(missing)}; install the demo extra: "
              "pip install 'budgetproxy[demo]'", file=sys.stderr)
        return 2
    if args.figure is not None:  # before the run: it takes minutes, the figure comes last
        from budgetproxy.demo.figure import NO_CHROMIUM, find_chromium

        if find_chromium() is None:
            print(f"budgetproxy demo: --figure: {NO_CHROMIUM}", file=sys.stderr)
            return 2
    from dataclasses import replace

    from budgetproxy.demo.run import DemoSettings, run_demo

    settings = DemoSettings.quick(args.out, args.seed) if args.quick else DemoSettings(
        out=args.out, seed=args.seed)
    settings = replace(settings, concurrency=args.concurrency, figure=args.figure)
    if args.k is not None:
        settings = replace(settings, k=args.k)
    try:
        run_demo(settings)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        import traceback

        traceback.print_exc()
        print(f"budgetproxy demo: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
