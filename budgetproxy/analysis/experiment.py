"""`analyze --experiment NAME`: a live experiment's arms, difference and decision from the logs.

Reads the episode records that name the experiment and the proxy's `experiment` record (its
settings, written at start), and computes what GET /v1/experiments/{name} gives for the same
episodes (core.experiment: the same finishing order, pairs and confidence sequence).
"""

from __future__ import annotations

import gzip
import json
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import orjson
from pydantic import ValidationError

from budgetproxy.analysis.db import InputError
from budgetproxy.config import ExperimentConfig
from budgetproxy.core.experiment import (
    DECISION_RECORD,
    Finished,
    experiment_from_record,
    experiment_view,
    finished_of,
)
from budgetproxy.core.rewards import OnExhausted
from budgetproxy.core.sequential import Decision


def _lines(path: str) -> Iterator[bytes]:
    opener: Any = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            yield from f
    except (OSError, EOFError):  # a truncated rotation: what was read counts
        return


def read_experiment(files: Sequence[str], name: str) -> dict[str, Any] | None:
    """The experiment's view from the logs, or None when no record of its settings is found
    (an InputError naming the file when that record is invalid)."""
    found = _read(files, name)
    if found is None:
        return None
    exp, finished, stopped = found
    return experiment_view(exp, finished, stopped)


def read_finished(files: Sequence[str], name: str) -> tuple[ExperimentConfig, list[Finished]]:
    """The experiment's settings and finished episodes from the logs (a LookupError when its
    settings record is missing)."""
    found = _read(files, name)
    if found is None:
        raise LookupError(name)
    return found[0], found[1]


def _read(files: Sequence[str], name: str) -> tuple[
        ExperimentConfig, list[Finished], Decision | None] | None:
    settings: dict[str, Any] | None = None
    settings_file = ""
    stopped: Decision | None = None
    episodes: dict[str, dict[str, Any]] = {}  # by id: the last record of each
    for path in files:
        for line in _lines(path):
            if name.encode() not in line:  # most lines: no JSON parse
                continue
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(rec, dict):
                continue
            kind = rec.get("type")
            if kind == "experiment" and rec.get("name") == name:
                settings, settings_file = rec, path
            elif kind == DECISION_RECORD and rec.get("experiment") == name:
                stopped = stopped or rec.get("decision")
            elif kind == "episode" and rec.get("experiment") == name and rec.get("arm"):
                episodes[str(rec.get("episode_id"))] = rec
    if settings is None:
        return None
    try:
        exp = experiment_from_record(settings)
    except ValidationError as exc:
        raise InputError(f"invalid settings record of experiment {name!r} in {settings_file}: "
                         f"{_problems(exc)}") from None
    on_exhausted: OnExhausted = ("zero" if settings.get("reward_on_exhausted") == "zero"
                                 else "keep")
    finished = [finished_of(exp, str(rec["arm"]), rec, on_exhausted)
                for rec in episodes.values()]
    return exp, finished, stopped


def _problems(exc: ValidationError) -> str:
    """A validation error's problems on one line: `arms: Field required; alpha: ...`."""
    return "; ".join(
        f"{'.'.join(str(part) for part in err['loc']) or 'record'}: "
        f"{' '.join(str(err['msg']).split())}"
        for err in exc.errors())


def run_experiment(files: Sequence[str], name: str, as_json: bool) -> int:
    view = read_experiment(files, name)
    if view is None:
        print(f"budgetproxy analyze: no record of experiment {name!r} in the logs (the proxy "
              "writes one when it starts with the experiment configured)", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(view, indent=2))
        return 0
    print(f"experiment {view['name']} (unit {view['unit']}, alpha {view['alpha']}, metric "
          f"{view['metric']} in [{view['metric_min']:g}, {view['metric_max']:g}], "
          f"{view['better']} is better)")
    for arm in view["arms"]:
        est = "-" if arm["estimate"] is None else f"{arm['estimate']:.4g}"
        print(f"  {arm['name']:<20} {arm['episodes']:>6} episodes, {arm['successes']:>6} "
              f"successes, mean {est}")
    for c in view["comparisons"]:
        d = c["difference"]
        est = "-" if d["estimate"] is None else f"{d['estimate']:+.4g}"
        print(f"  {c['a']} - {c['b']}: {est} [{d['cs_low']:+.4g}, {d['cs_high']:+.4g}] "
              f"over {d['pairs']} pairs: {c['decision']}")
    if view.get("caution"):
        print(f"  caution: {view['caution']}")
    return 0
