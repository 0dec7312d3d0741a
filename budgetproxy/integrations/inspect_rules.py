"""The inspect-ai integration's rules, as values: episode ids, episode options from metadata,
outcomes from scores, and whether a sample may make another model call."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from budgetproxy.core.ids import is_valid_episode_id
from budgetproxy.core.spec import PRINTABLE_PATTERN, TASK_ID_MAX_CHARS

URL_VAR = "BUDGETPROXY_URL"
KEY_VAR = "BUDGETPROXY_API_KEY"
PREFIX = "budgetproxy_"

# Options, as `budgetproxy_<name>` metadata keys, and the type each takes. The episode's go to
# POST /v1/episodes as they are; the outcome's say how a score becomes an outcome.
EPISODE_OPTIONS: dict[str, type] = {
    "budget": int, "max_turns": int, "disclosure": str, "announced_budget": int, "group": str,
    "token_budget": int, "cost_budget": float, "time_budget_s": float,
}
OUTCOME_OPTIONS: dict[str, type] = {"success_threshold": float, "scorer": str}
DEFAULT_THRESHOLD = 1.0

_SAMPLE_PART = re.compile(r"[A-Za-z0-9._\-]{1,64}")
_PRINTABLE = re.compile(PRINTABLE_PATTERN)


class OptionError(ValueError):
    """A `budgetproxy_*` metadata key the integration does not know, or a bad value."""


@dataclass(frozen=True)
class Connection:
    """Where the proxy is, from the environment: BUDGETPROXY_URL (and BUDGETPROXY_API_KEY, the
    bearer key of its episode API when it has keys)."""

    url: str
    api_key: str | None


def connection(environ: Mapping[str, str]) -> Connection | None:
    """The proxy to use, or None (integration off) when BUDGETPROXY_URL is not set."""
    url = environ.get(URL_VAR, "").strip()
    if not url:
        return None
    return Connection(url, environ.get(KEY_VAR) or None)


def options(*layers: Mapping[str, Any] | None) -> dict[str, Any]:
    """The `budgetproxy_*` keys of metadata layers, later layers winning (the eval's and the
    task's metadata, then the sample's), checked and without the prefix."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in (layer or {}).items():
            if not isinstance(key, str) or not key.startswith(PREFIX):
                continue
            name = key[len(PREFIX):]
            kind = EPISODE_OPTIONS.get(name) or OUTCOME_OPTIONS.get(name)
            if kind is None:
                known = ", ".join(PREFIX + k for k in (*EPISODE_OPTIONS, *OUTCOME_OPTIONS))
                raise OptionError(f"unknown metadata key {key!r} (known: {known})")
            out[name] = None if value is None else _typed(key, value, kind)
    if out.get("disclosure") not in (None, "hidden", "disclosed"):
        raise OptionError(f"{PREFIX}disclosure must be 'hidden' or 'disclosed', "
                          f"not {out['disclosure']!r}")
    return out


def _typed(key: str, value: Any, kind: type) -> Any:
    if kind is str:
        if isinstance(value, str | int) and not isinstance(value, bool):
            return str(value)
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().isdigit():
            return int(value)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if math.isfinite(value):
            return float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            pass
        else:
            if math.isfinite(number):
                return number
    raise OptionError(f"{key} must be {'a number' if kind is float else kind.__name__}, "
                      f"not {value!r}")


def episode_fields(opts: Mapping[str, Any]) -> dict[str, Any]:
    """The POST /v1/episodes fields among the options (unset ones left to the proxy)."""
    return {k: v for k, v in opts.items() if k in EPISODE_OPTIONS and v is not None}


def sample_part(sample_id: int | str) -> str:
    """A sample id as a piece of an episode id: itself when it is made of the characters ids
    take (and short), else a hash of it."""
    text = str(sample_id)
    if _SAMPLE_PART.fullmatch(text):
        return text
    return "h" + hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def episode_id(eval_id: str, sample_id: int | str, epoch: int, attempt: int = 1) -> str:
    """The episode of one sample × epoch of an eval (and, when inspect retries the sample
    after an error, of that attempt): `{eval_id}:{sample}:{epoch}[:a{attempt}]`."""
    eid = f"{eval_id}:{sample_part(sample_id)}:{epoch}"
    if attempt > 1:
        eid += f":a{attempt}"
    if is_valid_episode_id(eid):
        return eid
    return "inspect:" + hashlib.blake2b(eid.encode(), digest_size=16).hexdigest()


def task_id(sample_id: int | str) -> str:
    """The episode's task id: the sample id, unless the proxy would refuse it as one."""
    text = str(sample_id)
    if 0 < len(text) <= TASK_ID_MAX_CHARS and _PRINTABLE.fullmatch(text):
        return text
    return sample_part(text)


@dataclass(frozen=True)
class Outcome:
    """What is reported for a scored sample."""

    success: bool
    reward: float
    scorer: str


def outcome(values: Mapping[str, float | None], opts: Mapping[str, Any]) -> Outcome | None:
    """The outcome of a sample from its scores as numbers (None: a score that is not one):
    the scorer named by `budgetproxy_scorer`, else the first; success when its value is at
    least `budgetproxy_success_threshold` (1.0: correct, 1 or true); reward = the value.
    None when there is no such score or it is not a number."""
    if not values:
        return None
    name = opts.get("scorer") or next(iter(values))
    value = values.get(name)
    if value is None or not math.isfinite(value):
        return None
    threshold = opts.get("success_threshold")
    threshold = DEFAULT_THRESHOLD if threshold is None else threshold
    return Outcome(value >= threshold, value, name)


@dataclass(frozen=True)
class Stop:
    """Why a sample may make no further model call: the axis that ran out and its numbers."""

    axis: str  # turns | tokens | cost | time | finished
    used: float
    limit: float
    message: str


def _spent(status: Mapping[str, Any]) -> tuple[str, float, float] | None:
    """The axis an episode has spent (as GET /v1/episodes/{id} tells), with used and budget."""
    named = status.get("exhausted_by")
    checks = (("turns", "turns_used", "budget"), ("tokens", "tokens_used", "token_budget"),
              ("cost", "cost_used", "cost_budget"), ("time", "time_used_s", "time_budget_s"))
    for axis, used_key, budget_key in checks:
        used, budget = status.get(used_key), status.get(budget_key)
        if isinstance(used, int | float) and isinstance(budget, int | float) and (
                used >= budget or named == axis):
            return axis, float(used), float(budget)
    return None


@dataclass
class CallGate:
    """Whether an episode's sample may make another model call. Past its budget the proxy
    would refuse the call (reject mode) or, in finish mode, answer `finish_replies` final
    replies and then refuse: an agent loop that keeps asking would end on an error. The gate
    stops the sample first, as an inspect limit, so it is scored like any other.

    While fewer calls have gone than the turn budget, the budget cannot be spent (a call
    spends at most one turn), so the episode's state is read only after that, or on every
    call when another axis (tokens, cost, time) has a budget."""

    budget: int | None
    other_axes: bool
    on_exhausted: str = "reject"
    finish_replies: int | None = 1
    passed: int = 0
    final: int = 0

    @classmethod
    def of(cls, created: Mapping[str, Any]) -> CallGate:
        """The gate of an episode the proxy has just created (its POST answer)."""
        budget = created.get("budget")
        return cls(
            budget=budget if isinstance(budget, int) else None,
            other_axes=any(created.get(k) is not None
                           for k in ("token_budget", "cost_budget", "time_budget_s")),
            on_exhausted=str(created.get("on_exhausted") or "reject"),
            finish_replies=created.get("finish_replies", 1),
        )

    def needs_status(self) -> bool:
        return self.other_axes or self.budget is None or self.passed >= self.budget

    def admit(self, status: Mapping[str, Any] | None) -> Stop | None:
        """None lets the call go (and counts it); a Stop ends the sample. `status` is the
        episode's GET answer (None when it was not needed or could not be read: the call
        goes, and the proxy decides)."""
        if status is not None:
            if status.get("status") == "finished":
                used = float(status.get("turns_used") or 0)
                return Stop("finished", used, float(status.get("budget") or used),
                            "the budgetproxy episode has finished")
            spent = _spent(status)
            if spent is not None:
                axis, used, limit = spent
                if self.on_exhausted == "finish" and (
                        self.finish_replies is None or self.final < self.finish_replies):
                    self.final += 1  # the proxy's final reply: the agent sees it
                else:
                    return Stop(axis, used, limit,
                                f"the budgetproxy episode has spent its {axis} budget "
                                f"({_number(used)} of {_number(limit)})")
        self.passed += 1
        return None


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
