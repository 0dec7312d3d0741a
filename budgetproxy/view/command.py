"""`budgetproxy view`: write (or serve on 127.0.0.1) the episode view of trajectory logs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DESCRIPTION = """\
Write one HTML page per episode from trajectory logs (.jsonl, .jsonl.gz; files or folders):
each call's new messages, the budget text the model saw, the reply and its tool calls, the
spend on every axis against the budget, retries, refunds and refusals, and the outcome; with
an index of tasks and a page per task. --serve serves the pages on 127.0.0.1 until Ctrl-C."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `view` subcommand; its handler is `run`."""
    p = subparsers.add_parser(
        "view",
        help="HTML pages of single episodes, turn by turn",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="log files or folders")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--episode", metavar="ID", help="only this episode")
    which.add_argument("--task", metavar="ID", help="only this task's episodes")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="where to write the pages (default ./episode-view; with --serve, a "
                   "temporary folder unless given)")
    p.add_argument("--serve", action="store_true",
                   help="serve the pages on 127.0.0.1 until interrupted")
    p.add_argument("--port", type=int, default=0,
                   help="port for --serve (default 0: a free one)")
    p.set_defaults(func=run)


def write_site(paths: list[str], out: Path, episode: str | None = None,
               task: str | None = None) -> tuple[int, Path]:
    """Read the logs and write the pages into `out`; (episodes shown, the page to open)."""
    from budgetproxy.view.logs import read_episodes
    from budgetproxy.view.page import INDEX, episode_page_name, site

    logs = read_episodes(paths, episode=episode, task=task)
    note = f"{len(logs.episodes)} episodes from {logs.files} log file(s)"
    if logs.skipped_lines:
        note += f"; {logs.skipped_lines} line(s) skipped (not a schema-1 record)"
    out.mkdir(parents=True, exist_ok=True)
    for name, page in site(logs.episodes, note).items():
        (out / name).write_text(page, encoding="utf-8")
    first = INDEX
    if episode is not None and logs.episodes:
        first = episode_page_name(logs.episodes[0].episode_id)
    return len(logs.episodes), out / first


def run(args: argparse.Namespace) -> int:
    """0 with pages written (or served until Ctrl-C), 1 when no episode matched, 2 on a path
    that does not exist or is not a JSONL log."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="budgetproxy-view-") as tmp:
        out = args.out or (Path(tmp) if args.serve else Path("episode-view"))
        try:
            count, first = write_site(args.paths, out, args.episode, args.task)
        except (FileNotFoundError, ValueError) as e:
            print(f"budgetproxy view: {e}", file=sys.stderr)
            return 2
        if not count:
            what = (f"episode {args.episode!r}" if args.episode else
                    f"task {args.task!r}" if args.task else "any episode")  # fmt: skip
            print(f"budgetproxy view: no records of {what} in the logs given", file=sys.stderr)
            return 1
        print(f"budgetproxy view: {count} episode page(s) in {out}; open {first}",
              file=sys.stderr)
        if not args.serve:
            return 0
        from budgetproxy.view.serve import serve_folder

        return serve_folder(out, args.port, first.name)
