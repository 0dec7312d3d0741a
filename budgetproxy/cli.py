"""The command line: `budgetproxy serve | analyze | export | probe | likelihood | demo | view`."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
from typing import Any

from budgetproxy import __version__
from budgetproxy.config import (
    ENV_CONFIG_FILE,
    ENV_MULTIPROC_DIR,
    Config,
    ConfigError,
    effective_config,
    load_config,
)


def _serve_overrides(args: argparse.Namespace) -> dict[str, Any]:
    over: dict[str, Any] = {}
    server: dict[str, Any] = {}
    if args.host is not None:
        server["host"] = args.host
    if args.port is not None:
        server["port"] = args.port
    if args.workers is not None:
        server["workers"] = args.workers
    if server:
        over["server"] = server
    if args.upstream is not None:
        over["upstreams"] = [{"name": "default", "base_url": args.upstream, "models": ["*"]}]
    if args.log_dir is not None:
        over["trajectories"] = {"dir": args.log_dir}
    if args.default_budget is not None:
        over["budget"] = {"default_turns": args.default_budget}
    if args.store is not None:
        over["store"] = {"kind": "redis", "url": args.store} if args.store.startswith(
            "redis") else {"kind": args.store}
    return over


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def _missing_package(config: Config) -> str | None:
    """What the config needs from an extra that is not installed, said in one line, checked
    before serving (a worker that failed to import would be restarted again and again)."""
    if config.store.kind == "redis" and not _installed("redis"):
        return "store.kind: redis needs the redis package: pip install 'budgetproxy[redis]'"
    for i, u in enumerate(config.upstreams):
        if u.kind == "litellm" and not _installed("litellm"):
            return (f"upstreams[{i}].kind: litellm needs the litellm package: "
                    "pip install 'budgetproxy[litellm]'")
    return None


def _retention_line(config: Config, rate: float) -> str:
    """What the configured retention implies at `rate` finished episodes a second."""
    from budgetproxy.core.retained import RETAINED_BYTES, retention_estimate
    from budgetproxy.store.memory import MAX_REMEMBERED

    ep = config.episodes
    if config.store.kind == "redis":
        return (f"retention: finished episodes are kept in Redis for {ep.retention_s:g} s "
                f"(episodes.retention_s); episodes.max_retained applies to the memory store only")
    kept, total = retention_estimate(rate, ep.retention_s, ep.max_retained, MAX_REMEMBERED)
    cap = (f", capped by episodes.max_retained ({ep.max_retained:,})"
           if ep.max_retained is not None else "")
    mib = 2**20
    ids = total - kept * RETAINED_BYTES
    return (f"retention: at {rate:g} finished episodes/s the memory store keeps {kept:,} finished "
            f"episodes (episodes.retention_s {ep.retention_s:g} s{cap}), at most "
            f"{kept * RETAINED_BYTES / mib:,.1f} MiB at {RETAINED_BYTES} bytes each, plus at "
            f"most {MAX_REMEMBERED:,} ids of forgotten ones ({ids / mib:,.1f} MiB): "
            f"{total / mib:,.1f} MiB in all")


def _serve(args: argparse.Namespace) -> int:
    path = args.config or os.environ.get(ENV_CONFIG_FILE)
    try:
        config = load_config(path, _serve_overrides(args))
    except ConfigError as e:
        # --upstream is written into the config as upstreams[0]: name the flag the user typed
        for problem in e.problems:  # every one found, a line each
            given = " (given as --upstream)" if args.upstream and problem.startswith(
                "upstreams.0.base_url") else ""
            print(f"budgetproxy: bad config: {problem}{given}", file=sys.stderr)
        return 2
    if not config.upstreams:
        print("budgetproxy: bad config: upstreams: no upstream configured; pass --upstream URL "
              "(an OpenAI-compatible base URL ending in /v1) or list upstreams in the config",
              file=sys.stderr)
        return 2
    missing = _missing_package(config)
    if missing:
        print(f"budgetproxy: {missing}", file=sys.stderr)
        return 2
    if args.check:
        print(effective_config(config), end="")
        print(f"budgetproxy: {_retention_line(config, args.episode_rate)}", file=sys.stderr)
        print(f"budgetproxy: config OK ({path or 'embedded defaults and flags'})", file=sys.stderr)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                        "%(message)s")
    if config.server.workers > 1:
        from budgetproxy.serve.workers import run_workers

        # Set before any worker imports prometheus_client, which reads it at import time. A
        # directory made here is removed on exit; one the user named is theirs to keep.
        own_dir = None
        if not os.environ.get(ENV_MULTIPROC_DIR):
            own_dir = os.environ[ENV_MULTIPROC_DIR] = tempfile.mkdtemp(prefix="budgetproxy-prom-")
        try:
            return run_workers(config)
        finally:
            if own_dir is not None:
                shutil.rmtree(own_dir, ignore_errors=True)
    from budgetproxy.serve.server import run_foreground

    return run_foreground(config)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="budgetproxy",
        description="OpenAI-compatible proxy that counts, caps and discloses turn budgets per "
        "agent episode.",
    )
    parser.add_argument("--version", action="version", version=f"budgetproxy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="run the proxy",
        description="Run the proxy: count, cap and disclose turn budgets per episode in front of "
        "OpenAI-compatible (and Anthropic Messages) upstreams. Flags override the config file; "
        "with neither, embedded defaults apply (memory store, ./trajectories, metrics on).",
    )
    serve.add_argument("--config", metavar="FILE",
                       help=f"YAML config file (or env {ENV_CONFIG_FILE}; default: none)")
    serve.add_argument("--host", help="address to listen on (default: server.host, 127.0.0.1)")
    serve.add_argument("--port", type=int,
                       help="port to listen on, 0 for a free one (default: server.port, 8080)")
    serve.add_argument("--upstream", metavar="URL",
                       help="OpenAI-compatible base URL ending in /v1, serving every model "
                       "(replaces the config's upstreams)")
    serve.add_argument("--log-dir", metavar="DIR",
                       help="trajectory JSONL directory (default: trajectories.dir, "
                       "./trajectories)")
    serve.add_argument("--default-budget", type=int, metavar="N",
                       help="turns for an episode that names none (default: budget.default_turns, "
                       "20)")
    serve.add_argument("--workers", type=int, metavar="N",
                       help="worker processes on one port; more than 1 needs the Redis store "
                       "(default: server.workers, 1)")
    serve.add_argument("--store", metavar="KIND_OR_URL",
                       help="'memory', or a redis:// URL for the Redis store (default: store.kind, "
                       "memory)")
    serve.add_argument("--check", action="store_true",
                       help="validate the config, print the effective config (secrets masked) and "
                       "exit: 0 when valid, 2 with a line naming each bad key when not")
    serve.add_argument("--episode-rate", type=float, default=20.0, metavar="N",
                       help="with --check: the finished episodes a second the retention memory "
                       "estimate assumes (default 20)")
    serve.set_defaults(func=_serve)
    for module in ("budgetproxy.analysis.command", "budgetproxy.analysis.export_command",
                   "budgetproxy.probe.command", "budgetproxy.likelihood.command",
                   "budgetproxy.demo.command",
                   "budgetproxy.view.command"):
        try:
            mod = __import__(module, fromlist=["register"])
        except ImportError:
            continue
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    return code
