"""Episode creation: resolve a new episode's budget and arm from its spec and the config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from budgetproxy.config import BudgetConfig, DisclosureConfig
from budgetproxy.core.budget import draw_budgetmix, draw_budgetmix_axis, draw_disclosed
from budgetproxy.core.episode import Arm, EpisodeState

# Bounds on what a client may attach to an episode (docs/security.md): every turn's span and
# the episode's record carry them. Texts in characters; JSON in bytes as the log writes it.
TASK_ID_MAX_CHARS = 256
GROUP_MAX_CHARS = 256
TAGS_MAX_BYTES = 8 * 1024
METADATA_MAX_BYTES = 64 * 1024


# Characters a task id, group or tag may not hold: C0/C1 controls, and the bidirectional
# formatting characters that make a log line, a label or a dashboard read other than it is
# (Unicode's Bidi_Control set: ALM, LRM, RLM, LRE..RLO, LRI..PDI).
_UNSAFE = frozenset(
    [chr(c) for c in range(0x20)] + ["\x7f"] + [chr(c) for c in range(0x80, 0xA0)]
    + ["\u061c", "\u200e", "\u200f"] + [chr(c) for c in range(0x202A, 0x202F)]
    + [chr(c) for c in range(0x2066, 0x206A)]
)


# The same rule as a JSON Schema pattern, for request bodies the API validates itself.
PRINTABLE_PATTERN = ("^[^\\x00-\\x1f\\x7f-\\x9f\\u061c\\u200e\\u200f\\u202a-\\u202e"
                     "\\u2066-\\u2069]*$")


def _printable(param: str, text: str) -> None:
    if not _UNSAFE.isdisjoint(text):
        bad = next(ch for ch in text if ch in _UNSAFE)
        raise SpecError(param, f"{param} holds the control or bidirectional formatting "
                        f"character U+{ord(bad):04X}, which ids, task names and tags may not")


def _printable_json(param: str, value: Any) -> None:
    """Every string in `value` (keys too) passes `_printable`."""
    if isinstance(value, str):
        _printable(param, value)
    elif isinstance(value, dict):
        for k, v in value.items():
            _printable(param, str(k))
            _printable_json(param, v)
    elif isinstance(value, list):
        for v in value:
            _printable_json(param, v)


class SpecError(ValueError):
    """A spec value that cannot be used; `param` names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class EpisodeSpec:
    episode_id: str
    budget: int | None = None
    max_turns: int | None = None
    task_id: str | None = None
    group: str | None = None
    disclosure: Arm | None = None
    announced_budget: int | None = None
    tags: dict[str, Any] = field(default_factory=dict)
    token_budget: int | None = None
    cost_budget: float | None = None
    time_budget_s: float | None = None
    announced_tokens: int | None = None
    announced_cost: float | None = None
    announced_time_s: float | None = None
    # the fewest turns the task can be solved in (analyze --ceiling); never enforced
    min_turns: int | None = None


def new_episode(
    spec: EpisodeSpec, budget_cfg: BudgetConfig, disclosure_cfg: DisclosureConfig, now: float
) -> EpisodeState:
    """Budget: explicit > BudgetMix draw for the group > max_turns > default_turns.

    Arm: explicit > the configured mode (a per-group draw in mixed mode).
    Draws are keyed on (seed, task_id, group), or the episode id for an episode in no group.
    """
    for param, text, most in (("task_id", spec.task_id, TASK_ID_MAX_CHARS),
                              ("group", spec.group, GROUP_MAX_CHARS)):
        if text is not None and len(text) > most:
            raise SpecError(param, f"{param} is {len(text)} characters long; at most {most}")
        if text is not None:
            _printable(param, text)
    _printable_json("tags", spec.tags)
    bm = budget_cfg.budgetmix
    sampled = budget_cfg.sampler == "budgetmix"
    max_turns = spec.max_turns
    if max_turns is None and sampled:
        max_turns = bm.max_turns
    group_key = spec.group if spec.group is not None else spec.episode_id
    if spec.budget is not None:
        budget = spec.budget
    elif sampled and max_turns is not None:
        budget = draw_budgetmix(budget_cfg.seed, spec.task_id, group_key, max_turns, bm.step)
    elif max_turns is not None:
        budget = max_turns
    else:
        budget = budget_cfg.default_turns
    if budget < 1:
        raise SpecError("budget", f"budget must be a positive number of turns, got {budget}")
    if max_turns is not None and budget > max_turns:
        raise SpecError("budget", f"budget {budget} is outside 1..max_turns ({max_turns})")
    if spec.min_turns is not None and spec.min_turns < 1:
        raise SpecError("min_turns", "min_turns must be a positive number of turns")
    if spec.announced_budget is not None and spec.announced_budget < 1:
        raise SpecError("announced_budget", "announced_budget must be a positive number of turns")
    arm: Arm
    if spec.disclosure is not None:
        arm = spec.disclosure
    elif disclosure_cfg.mode == "mixed":
        disclosed = draw_disclosed(
            budget_cfg.seed, spec.task_id, group_key, disclosure_cfg.disclosed_fraction
        )
        arm = "disclosed" if disclosed else "hidden"
    else:
        arm = disclosure_cfg.mode
    for name in ("token_budget", "cost_budget", "time_budget_s", "announced_tokens",
                 "announced_cost", "announced_time_s"):
        value = getattr(spec, name)
        if value is not None and not value > 0:
            raise SpecError(name, f"{name} must be positive, got {value}")
    drawn: dict[str, float] = {}
    if sampled:  # BudgetMix over the other axes whose full budget is configured
        for axis, full in (("tokens", bm.max_tokens), ("cost", bm.max_cost_usd),
                           ("time", bm.max_time_s)):
            if full is not None:
                drawn[axis] = draw_budgetmix_axis(budget_cfg.seed, spec.task_id, group_key,
                                                  axis, full, bm.step)
    tokens_drawn = drawn.get("tokens")
    return EpisodeState(
        token_budget=_or(spec.token_budget, None if tokens_drawn is None else max(
            1, round(tokens_drawn)), budget_cfg.default_tokens),
        cost_budget=_or(spec.cost_budget, drawn.get("cost"), budget_cfg.default_cost_usd),
        time_budget_s=_or(spec.time_budget_s, drawn.get("time"), budget_cfg.default_time_s),
        announced_tokens=spec.announced_tokens,
        announced_cost=spec.announced_cost,
        announced_time_s=spec.announced_time_s,
        episode_id=spec.episode_id,
        budget=budget,
        max_turns=max_turns,
        disclosure=arm,
        task_id=spec.task_id,
        group=spec.group,
        announced_budget=spec.announced_budget,
        tags=dict(spec.tags),
        min_turns=spec.min_turns,
        created_at=now,
        last_activity=now,
    )


def _or(*values: Any) -> Any:
    """The first value that is not None (explicit > BudgetMix draw > config default)."""
    return next((v for v in values if v is not None), None)
