"""`budgetproxy analyze`: Pass@(K,T) tables, report, recovery view, BudgetMix audit, export.

Importing this module is cheap: DuckDB and numpy load only when the command runs.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from budgetproxy.analysis.passk import to_fraction
from budgetproxy.core.budget import TURNS_MAX

T = TypeVar("T")

DEFAULT_MEMORY_LIMIT = "1GB"

DESCRIPTION = """\
Read trajectory logs (JSONL, .jsonl.gz, Parquet; files or folders) and print Pass@(K,T):
the chance that at least one of K episodes of a task succeeds within T turns, estimated per
task and averaged over tasks, with 95% bootstrap confidence intervals over tasks."""


def _list_of(parse: Callable[[str], T], what: str) -> Callable[[str], list[T]]:
    def parse_list(text: str) -> list[T]:
        try:
            values = [parse(part) for part in text.split(",") if part.strip()]
        except (ValueError, ZeroDivisionError) as exc:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from exc
        if not values:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return values

    return parse_list


def _positive_int(text: str) -> int:
    value = int(text)
    if not 1 <= value <= TURNS_MAX:
        raise ValueError(text)
    return value


def _percent(text: str) -> Fraction:
    value = to_fraction(text)
    if not 0 < value <= 100:
        raise ValueError(text)
    return value


def _step(text: str) -> Fraction:
    # At least 0.001: the grid has round(1/step) candidates, and a step of 1e-400 would be
    # a list no machine holds.
    what = f"step must be in [0.001, 1], got {text!r}"
    try:
        value = to_fraction(text)
    except (ValueError, ZeroDivisionError) as exc:
        raise argparse.ArgumentTypeError(what) from exc
    if not Fraction(1, 1000) <= value <= 1:
        raise argparse.ArgumentTypeError(what)
    return value


def _int_in(low: int, high: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from exc
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


def _alpha(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a level in (0, 1), got {text!r}") from exc
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a level in (0, 1), got {text!r}")
    return value


def _memory(text: str) -> str:
    if not re.fullmatch(r"\d+(\.\d+)?\s*(KB|MB|GB|TB|KiB|MiB|GiB|TiB)", text.strip(), re.I):
        raise argparse.ArgumentTypeError(f"expected a size like 2GB or 512MB, got {text!r}")
    return text.strip()


def _comparison(text: str) -> Any:
    from budgetproxy.analysis.compare import parse_comparison

    try:
        return parse_comparison(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _one_line_errors(parser: argparse.ArgumentParser) -> None:
    """A bad argument is one line naming the flag, exit 2 (argparse would add the usage)."""

    def error(message: str) -> NoReturn:
        parser.exit(2, f"budgetproxy analyze: {message}\n")

    parser.error = error  # type: ignore[method-assign]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `analyze` subcommand; its handler is `run`."""
    p = subparsers.add_parser(
        "analyze",
        help="Pass@(K,T) tables and reports from trajectory logs",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="log files or folders")
    p.add_argument(
        "--k",
        type=_list_of(_positive_int, "K values like 1,2,4,8"),
        default=[1, 2, 4, 8],
        help="sample counts K (default 1,2,4,8)",
    )
    p.add_argument(
        "--tiers",
        type=_list_of(_percent, "percentages in (0, 100] like 25,50,75,100"),
        help="budget tiers in %% of each task's max_turns (default 25,50,75,100); with "
        "--axis, of each episode's full budget on that axis",
    )
    p.add_argument(
        "--turns",
        type=_list_of(_positive_int, "turn counts like 2,4,8"),
        help="absolute turn budgets T, instead of (or with --tiers, besides) tiers",
    )
    p.add_argument(
        "--by",
        type=_list_of(str.strip, "field names"),
        default=[],
        help="split by disclosure, model, group, task_id or a tag name "
        "(comma-separated for several)",
    )
    p.add_argument(
        "--compare",
        type=_comparison,
        action="append",
        default=[],
        metavar="FIELD=A,B",
        help="paired differences A − B per task, with bootstrap CIs, per cell: e.g. "
        "disclosure=disclosed,hidden or model=rl,base (a --by field or tag; may repeat)",
    )
    p.add_argument(
        "--experiment",
        metavar="NAME",
        help="a live experiment's arms, always-valid difference and decision from the logs "
        "(docs/experiments.md)",
    )
    p.add_argument(
        "--over",
        metavar="FIELD",
        type=str.strip,
        help="training dynamics: Pass@(K,T) per checkpoint, a value of this episode field or "
        "tag (step, model, ...), ordered numerically when every value is a number, else by "
        "first appearance",
    )
    p.add_argument(
        "--ceiling",
        action="store_true",
        help="add to each cell the share of its tasks solvable within T at all (from each "
        "task's min_turns, else the shortest success observed) and the headroom",
    )
    p.add_argument(
        "--tasks",
        type=Path,
        metavar="FILE",
        help="with --ceiling: per-task min_turns (JSONL objects, or CSV with a header, naming "
        "task_id and min_turns), over the episodes' own",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--report", type=Path, metavar="FILE.html", help="write an HTML report")
    p.add_argument(
        "--view",
        type=Path,
        metavar="DIR",
        help="also write the episode view (budgetproxy view) of the JSONL logs into DIR; the "
        "report's task rows link to it",
    )
    p.add_argument(
        "--seed",
        type=_int_in(0, 2**63 - 1, "a seed in 0..2^63-1"),
        default=0,
        help="bootstrap seed (default 0)",
    )
    p.add_argument(
        "--adjust",
        choices=["holm", "bh", "none"],
        default="holm",
        help="--compare: adjust the cells' p-values over each comparison, Holm (family-wise, "
        "the default), bh (Benjamini-Hochberg, false discovery rate) or none; a star means "
        "the adjusted p is below 0.05",
    )
    p.add_argument(
        "--resamples",
        type=_int_in(1, 1_000_000, "a number of resamples in 1..1000000"),
        default=1000,
        help="bootstrap resamples (default 1000)",
    )
    p.add_argument(
        "--memory-limit",
        type=_memory,
        default=DEFAULT_MEMORY_LIMIT,
        metavar="SIZE",
        help=f"DuckDB's memory limit; past it, work spills to a temp folder "
        f"(default {DEFAULT_MEMORY_LIMIT})",
    )
    p.add_argument(
        "--audit-budgetmix",
        action="store_true",
        help="check budgets against BudgetMix (on the candidate grid, one budget and arm per "
        "group, uniform draws); the audit's verdict alone sets the exit status: 0 OK, 1 not",
    )
    p.add_argument(
        "--audit-groups",
        metavar="REGEX",
        help="audit only episodes whose group matches this RE2 regex (searched, not anchored; "
        "'.' = every episode that has a group), so episodes run at fixed budgets in the same "
        "log do not count as draws; implies --audit-budgetmix",
    )
    p.add_argument(
        "--budgetmix-step",
        type=_step,
        default=Fraction(1, 10),
        help="BudgetMix candidate step (default 0.1)",
    )
    p.add_argument(
        "--budgetmix-alpha",
        type=_alpha,
        default=0.01,
        help="significance level of the uniformity test (default 0.01)",
    )
    p.add_argument(
        "--error-pattern",
        metavar="REGEX",
        help="recovery view: tool results matching this (RE2) regex are errors",
    )
    p.add_argument(
        "--to-parquet",
        type=Path,
        metavar="OUT",
        help="write OUT/episodes.parquet and OUT/turns.parquet",
    )
    p.add_argument(
        "--axis",
        choices=["turns", "tokens", "cost", "seconds"],
        help="Pass@(K,B) along this axis, at --budgets and/or --tiers (of each episode's full "
        "budget on it): success within B = spend on it at the success turn <= B",
    )
    p.add_argument(
        "--budgets",
        type=_list_of(_positive_float, "budgets like 2000,4000,8000"),
        help="budgets B along --axis (default turns; Pass@(K,B); see docs/budgets.md for "
        "who counts)",
    )
    p.add_argument(
        "--hold",
        type=_list_of(str.strip, "AXIS=VALUE pairs"),
        default=[],
        help="with --axis: levels of the other axes, e.g. turns=20,tokens=none (default: "
        "each level the episodes were run at)",
    )
    p.add_argument(
        "--price",
        action="append",
        default=[],
        metavar="GLOB=IN,OUT",
        help="with --axis cost: USD per million input and output tokens for models matching "
        "GLOB, over the price library's (may repeat)",
    )
    _one_line_errors(p)
    p.set_defaults(func=run)


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise ValueError(text)
    return value


def run(args: argparse.Namespace) -> int:
    """Run `analyze`; returns the exit code (0 ok, 1 nothing to report, 2 bad arguments or
    paths). With the BudgetMix audit, 0 or 1 is the audit's verdict alone."""
    from budgetproxy.analysis.load import InputError

    try:
        return _run(args)
    except InputError as exc:
        print(f"budgetproxy analyze: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        import duckdb

        if not isinstance(exc, duckdb.Error):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"budgetproxy analyze: {first}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    if args.experiment is not None:
        from budgetproxy.analysis.experiment import run_experiment
        from budgetproxy.analysis.load import discover

        return run_experiment(discover(args.paths).jsonl, args.experiment, args.json)
    if args.budgets or args.axis is not None or args.hold:
        for flag, given in (("--over", args.over), ("--ceiling", args.ceiling)):
            if given:
                _usage_error(f"{flag} reads turns: it does not combine with --axis or --budgets")
        from budgetproxy.analysis.axis_command import run_axis

        return run_axis(args)
    from budgetproxy.analysis import load
    from budgetproxy.analysis.compare import format_differences
    from budgetproxy.analysis.progress import Progress
    from budgetproxy.analysis.table import Budget, compute_cells, format_cells

    if getattr(args, "view", None) is not None and args.report is None:
        raise load.InputError("--view links the report's task rows: give --report FILE.html "
                              "too (budgetproxy view writes the pages alone)", 2)
    if args.price:
        raise load.InputError("--price prices spend along --axis (e.g. --axis cost)", exit_code=2)
    if args.tasks is not None and not args.ceiling:
        raise load.InputError("--tasks gives the ceiling's per-task minima: add --ceiling", 2)
    stated = None
    if args.tasks is not None:
        from budgetproxy.analysis.ceiling import read_tasks_file

        stated = read_tasks_file(args.tasks)
    inputs = load.discover(args.paths)
    if not inputs.files:
        raise load.InputError(
            f"no trajectory logs (*.jsonl, *.jsonl.gz, *.parquet) in {', '.join(args.paths)}"
        )
    tiers = args.tiers if args.tiers is not None else ([] if args.turns else [25, 50, 75, 100])
    budgets = [Budget("tier", Fraction(p)) for p in tiers]
    budgets += [Budget("turns", Fraction(t)) for t in args.turns or []]
    progress = Progress(inputs.total_bytes)
    out: dict[str, Any] = {}
    text: list[str] = []
    code = 0
    with load.connect(getattr(args, "memory_limit", DEFAULT_MEMORY_LIMIT)) as con:
        if args.error_pattern is not None:
            _check_pattern(con, args.error_pattern, "--error-pattern")
        if args.audit_groups is not None:
            _check_pattern(con, args.audit_groups, "--audit-groups")
        fields = load.EPISODE_FIELDS if args.to_parquet is not None else load.TABLE_FIELDS
        if args.over is not None:  # first appearance is the earliest start
            fields = (*fields, "started_at")
        summary = load.load_episodes(con, inputs, progress, fields)
        _print_skipped(summary)
        if summary.episodes == 0:
            raise load.InputError(
                f"no episode records in {summary.files} readable file(s) "
                f"({summary.turn_records:,} turn records, {summary.skipped:,} skipped)"
            )
        counts = _episode_counts(con)
        cells = compute_cells(con, args.k, budgets, args.by, args.resamples, args.seed)
        for i, name in enumerate(args.by):
            if cells and all(c.by[i][1] is None for c in cells):
                print(f"budgetproxy analyze: --by {name}: no episode has this field or tag",
                      file=sys.stderr)  # fmt: skip
        out["pass_at"] = [c.as_json() for c in cells]
        minima = ceilings = None
        if args.ceiling:
            from budgetproxy.analysis.ceiling import (
                compute_ceilings,
                contradicted,
                format_ceilings,
                task_minima,
            )

            minima = task_minima(con, stated)
            for task, said, seen in contradicted(con, minima)[:5]:
                print(f"budgetproxy analyze: task {task}: min_turns {said}, but an episode "
                      f"succeeded at turn {seen}", file=sys.stderr)  # fmt: skip
            ceilings = compute_ceilings(con, cells, budgets, args.by, minima, args.resamples,
                                        args.seed)
            out["pass_at"] = [{**c.as_json(), **x.as_json()}
                              for c, x in zip(cells, ceilings, strict=True)]
        over = None
        if args.over is not None:
            over, missing = _over(con, args, budgets, minima)
            out["over"] = [p.as_json() for p in over]
        out["inputs"] = _inputs_json(summary)
        out["episodes"] = counts
        out["settings"] = {
            "k": args.k,
            "tiers": [f"{b.label}" for b in budgets if b.kind == "tier"],
            "turns": args.turns or [],
            "by": args.by,
            "compare": [f"{c.field}={c.a},{c.b}" for c in args.compare],
            "adjust": args.adjust,
            "resamples": args.resamples,
            "seed": args.seed,
            "confidence": 0.95,
            "over": args.over,
            "ceiling": args.ceiling,
        }
        text += [_summary_text(summary, counts), format_cells(cells, args.resamples, args.seed)]
        sections: list[str] = []
        if ceilings is not None:
            from budgetproxy.analysis.ceiling import ceiling_charts

            text.append(format_ceilings(cells, ceilings))
            sections.append(ceiling_charts(cells, ceilings))
        if over is not None:
            from budgetproxy.analysis.dynamics import format_over, over_charts

            out["settings"]["over_missing_episodes"] = missing
            text.append(format_over(over, args.over, missing))
            sections.append(over_charts(over, args.over))
        differences = _compare(con, args, budgets)
        if args.compare:
            out["compare"] = [d.as_json() for _, ds in differences for d in ds]
            text += [format_differences(ds, args.resamples, args.seed, comparison=c)
                     for c, ds in differences]
        extra: list[tuple[str, str]] = []
        if args.error_pattern is not None:
            from budgetproxy.analysis.recovery import compute_recovery, format_recovery

            rows = compute_recovery(con, summary.readable, args.error_pattern, progress)
            if not any(r.errors for r in rows):
                print(
                    f"budgetproxy analyze: no tool result matched /{args.error_pattern}/ "
                    "(logs written with trajectories.content: none carry no texts)",
                    file=sys.stderr,
                )
            out["recovery"] = [r.as_json() for r in rows]
            text.append(format_recovery(rows, args.error_pattern))
            extra.append(("Recovery after tool errors", text[-1]))
        auditing = args.audit_budgetmix or args.audit_groups is not None
        if auditing:
            from budgetproxy.analysis.audit import audit_budgetmix, format_audit

            audit = audit_budgetmix(
                con, args.budgetmix_step, args.budgetmix_alpha, args.audit_groups
            )
            out["audit"] = audit.as_json()
            text.append(format_audit(audit))
            extra.append(("BudgetMix audit", text[-1]))
            code = 0 if audit.ok else 1
        if args.report is not None:
            _write_report(con, args, cells, budgets, summary, counts, extra, sections)
            out["report"] = str(args.report)
        if args.to_parquet is not None:
            from budgetproxy.analysis.export import export_parquet

            load.create_turns_view(con, summary.readable)
            episodes_file, turns_file = export_parquet(con, args.to_parquet, progress)
            out["parquet"] = {"episodes": str(episodes_file), "turns": str(turns_file)}
            print(f"wrote {episodes_file} and {turns_file}", file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=2, ensure_ascii=False))
    else:
        print("\n".join(text), end="")
    if all(c.value is None for c in cells):
        print(
            "budgetproxy analyze: no eligible episodes: no task has K eligible episodes at any "
            "T (see the eligibility rules: abandoned and task-less episodes never count)",
            file=sys.stderr,
        )
        if not auditing:  # the audit's verdict decides the exit status on its own
            code = 1
    return code


def _compare(
    con: Any, args: argparse.Namespace, budgets: Sequence[Any]
) -> list[tuple[Any, list[Any]]]:
    """Per --compare: the comparison and its cells (p-values adjusted per --adjust); a value
    no episode has is said."""
    from budgetproxy.analysis.compare import adjusted, compute_differences
    from budgetproxy.analysis.table import by_expression

    out = []
    for comparison in args.compare:
        found = {
            r[0]
            for r in con.execute(
                f"SELECT DISTINCT {by_expression(comparison.field)} FROM episodes"
            ).fetchall()
        }
        for value in (comparison.a, comparison.b):
            if value not in found:
                print(f"budgetproxy analyze: --compare {comparison.field}={comparison.a},"
                      f"{comparison.b}: no episode has {comparison.field} = {value!r}",
                      file=sys.stderr)  # fmt: skip
        cells = compute_differences(
            con, comparison, args.k, budgets, args.by, args.resamples, args.seed
        )
        out.append((comparison, adjusted(cells, args.adjust)))
    return out


def _usage_error(message: str) -> NoReturn:
    from budgetproxy.analysis.load import InputError

    raise InputError(message, exit_code=2)


def _over(
    con: Any, args: argparse.Namespace, budgets: Sequence[Any], minima: Any
) -> tuple[list[Any], int]:
    """--over: the checkpoints in order with their cells (and ceilings with --ceiling), and
    how many usable episodes name no checkpoint."""
    from budgetproxy.analysis.dynamics import checkpoints, split_over
    from budgetproxy.analysis.table import compute_cells

    if args.over in args.by:
        _usage_error(f"--over {args.over}: the field is already in --by")
    order, missing = checkpoints(con, args.over)
    if not order:
        print(f"budgetproxy analyze: --over {args.over}: no episode has this field or tag",
              file=sys.stderr)  # fmt: skip
    by = [args.over, *args.by]
    cells = compute_cells(con, args.k, budgets, by, args.resamples, args.seed)
    extra = None
    if minima is not None:
        from budgetproxy.analysis.ceiling import compute_ceilings

        extra = [x.as_json() for x in compute_ceilings(con, cells, budgets, by, minima,
                                                       args.resamples, args.seed)]
    return split_over(cells, order, extra), missing


def _check_pattern(con: Any, pattern: str, flag: str) -> None:
    from budgetproxy.analysis.load import InputError

    try:
        con.execute("SELECT regexp_matches('', ?)", [pattern]).fetchall()
    except Exception as exc:
        raise InputError(f"{flag} {pattern!r} is not a valid RE2 regex", 2) from exc


def _episode_counts(con: Any) -> dict[str, int]:
    row = con.execute(
        """
        SELECT count(*),
            count(*) FILTER (WHERE end_reason = 'abandoned'),
            count(*) FILTER (WHERE end_reason <> 'abandoned' AND task_id IS NULL),
            count(*) FILTER (WHERE end_reason <> 'abandoned' AND task_id IS NOT NULL
                             AND max_turns IS NULL)
        FROM episodes
        """
    ).fetchone()
    total, abandoned, no_task, no_max = (int(v) for v in row)
    return {
        "total": total,
        "used": total - abandoned - no_task,
        "left_out_abandoned": abandoned,
        "left_out_no_task_id": no_task,
        "no_max_turns": no_max,
    }


def _inputs_json(summary: Any) -> dict[str, Any]:
    return {
        "files": summary.files,
        "bytes": summary.bytes,
        "turn_records": summary.turn_records,
        "episode_records": summary.episode_records,
        "duplicate_episode_records": summary.duplicates,
        "skipped": summary.skipped,
        "skipped_reasons": {reason: n for reason, n, _ in summary.reasons},
        "unreadable_files": [{"file": f, "reason": why} for f, why in summary.unreadable],
    }


def read_line(summary: Any) -> str:
    """What was read: files, size, records and how many were skipped (every analysis path)."""
    return (f"read {summary.files:,} file(s), {summary.bytes / 1e6:,.1f} MB: "
            f"{summary.turn_records:,} turn records, {summary.episode_records:,} episode records"
            + (f", {summary.skipped:,} skipped" if summary.skipped else ""))


def duplicates_lines(summary: Any) -> list[str]:
    """The duplicate episode records read, if any (the last of each is kept)."""
    if not summary.duplicates:
        return []
    return [f"{summary.duplicates:,} duplicate episode records (the last one kept)"]


def _summary_text(summary: Any, counts: dict[str, int]) -> str:
    lines = [
        read_line(summary),
        f"episodes: {counts['total']:,}; left out: {counts['left_out_abandoned']:,} abandoned, "
        f"{counts['left_out_no_task_id']:,} without task_id",
        *duplicates_lines(summary),
    ]
    if counts["no_max_turns"]:
        lines.append(
            f"{counts['no_max_turns']:,} episodes without max_turns: left out of "
            f"tier columns (use --turns)"
        )
    return "\n".join(lines) + "\n"


def _print_skipped(summary: Any, shown: int = 5) -> None:
    for path, why in summary.unreadable:
        print(f"skipped unreadable file {path}: {why}", file=sys.stderr)
    if not summary.skipped:
        return
    print(f"skipped {summary.skipped:,} record(s):", file=sys.stderr)
    for reason, n, example in summary.reasons[:shown]:
        print(f"  {n:,} × {reason}  (e.g. {example[:120]})", file=sys.stderr)
    if len(summary.reasons) > shown:
        print(f"  … and {len(summary.reasons) - shown} more reason(s); see --json", file=sys.stderr)


def _write_report(
    con: Any,
    args: argparse.Namespace,
    cells: Sequence[Any],
    budgets: Sequence[Any],
    summary: Any,
    counts: dict[str, int],
    extra: Sequence[tuple[str, str]],
    sections: Sequence[str] = (),
) -> None:
    from budgetproxy.analysis.report import render_report
    from budgetproxy.analysis.table import compute_cells

    by = args.by or ["disclosure"]
    if not args.by:
        cells = compute_cells(con, args.k, budgets, by, args.resamples, args.seed)
    facts = {
        "inputs": f"{summary.files:,} file(s), {summary.turn_records:,} turn records, "
        f"{summary.episode_records:,} episode records, {summary.skipped:,} skipped",
        "episodes": f"{counts['total']:,} ({counts['left_out_abandoned']:,} abandoned and "
        f"{counts['left_out_no_task_id']:,} without task_id left out)",
        "K": ", ".join(map(str, args.k)),
        "split by": ", ".join(by),
        "confidence intervals": f"95%, {args.resamples} bootstrap resamples over tasks, "
        f"seed {args.seed}",
    }
    from budgetproxy.analysis.compare import adjusted, compute_differences

    differences = [
        adjusted(compute_differences(con, c, args.k, budgets, by, args.resamples, args.seed),
                 args.adjust)
        for c in args.compare
    ]
    view = None
    if args.view is not None:
        import os

        from budgetproxy.view.command import write_site

        count, _ = write_site(list(args.paths), args.view)
        print(f"wrote {count:,} episode page(s) in {args.view}", file=sys.stderr)
        view = Path(os.path.relpath(args.view.resolve(), args.report.parent.resolve())).as_posix()
    html = render_report(con, cells, by, facts, extra, differences, args.resamples, args.seed,
                         view, sections)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(html, encoding="utf-8")
    print(f"wrote {args.report}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m budgetproxy.analysis PATH...`: the subcommand on its own."""
    parser = argparse.ArgumentParser(prog="budgetproxy")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["analyze", *(sys.argv[1:] if argv is None else argv)])
    result: int = args.func(args)
    return result
