"""The `budgetproxy export` command: trajectory logs to one row per episode for trainers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "export",
        help="write one row per episode (conversation, tokens, reward, advantage) for trainers",
        description="Read trajectory logs (files or folders, JSONL or Parquet) and write "
        "DIR/episodes.parquet (or .jsonl): one row per episode with its budget, tier, arm, "
        "group, end reason, reward after the budget rule, GRPO advantage within its group, "
        "the conversation as the model saw it and, when tokens were captured, token ids, "
        "logprobs and loss masks. Loads with pandas, polars and datasets.load_dataset.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="trajectory log files or folders")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write into")
    p.add_argument("--format", choices=["parquet", "jsonl"], default="parquet",
                   help="file format (default: parquet)")
    p.add_argument("--on-exhausted", choices=["zero", "keep"], default="keep",
                   help="reward of an exhausted episode: 0, or what was reported (default: "
                   "keep; the proxy's reward.on_exhausted)")
    p.add_argument("--scale-by-std", action="store_true",
                   help="divide advantages by the group's reward std (default: mean only)")
    p.add_argument("--placement", choices=["last_message", "system", "new_message", "none"],
                   default="last_message",
                   help="where the proxy placed disclosure texts, to rebuild the conversation "
                   "the model saw (default: last_message, the proxy's default; none: the "
                   "client's messages only)")
    p.add_argument("--history", choices=["keep", "drop"], default="keep",
                   help="the proxy's disclosure.history (default: keep)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from budgetproxy.analysis.db import InputError, connect
    from budgetproxy.analysis.rollout_export import episode_rows, read_logs, write

    try:
        with connect(command="export") as con:
            episodes, turns = read_logs(con, args.paths)
            if not episodes:
                print("budgetproxy export: no finished episodes in the logs", file=sys.stderr)
                return 1
            rows = episode_rows(
                episodes, turns, on_exhausted=args.on_exhausted,
                scale_by_std=args.scale_by_std,
                placement=None if args.placement == "none" else args.placement,
                keep_history=args.history == "keep")
            target = write(con, rows, Path(args.out), args.format)
    except InputError as exc:
        print(f"budgetproxy export: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"{len(rows)} episodes -> {target}")
    return 0
