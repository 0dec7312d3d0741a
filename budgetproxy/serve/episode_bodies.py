"""The episode API's request bodies: their fields, bounds and the JSON they may carry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    WithJsonSchema,
)

from budgetproxy.config import NAME_PATTERN
from budgetproxy.core.budget import TURNS_MAX
from budgetproxy.core.spec import (
    GROUP_MAX_CHARS,
    METADATA_MAX_BYTES,
    PRINTABLE_PATTERN,
    TAGS_MAX_BYTES,
    TASK_ID_MAX_CHARS,
)

EPISODE_ID_PATTERN = r"^[A-Za-z0-9._:\-]{1,128}$"
# Numbers in tags and metadata: what every store and the log write exactly (64-bit).
NUMBER_MIN, NUMBER_MAX = -(2**63), 2**63 - 1
JSON_VALUE_SCHEMA: dict[str, Any] = {"anyOf": [
    {"type": "null"}, {"type": "boolean"}, {"type": "string"},
    {"type": "number", "minimum": NUMBER_MIN, "maximum": NUMBER_MAX},
    {"type": "array", "items": {"$ref": "#/components/schemas/JsonValue"}},
    {"type": "object", "additionalProperties": {"$ref": "#/components/schemas/JsonValue"}},
]}
# Tags: the same JSON, but every string (keys too) printable (core.spec: no control or
# bidirectional formatting characters); the check itself is new_episode's.
TAG_VALUE_SCHEMA: dict[str, Any] = {"anyOf": [
    {"type": "null"}, {"type": "boolean"}, {"type": "string", "pattern": PRINTABLE_PATTERN},
    {"type": "number", "minimum": NUMBER_MIN, "maximum": NUMBER_MAX},
    {"type": "array", "items": {"$ref": "#/components/schemas/TagValue"}},
    {"type": "object", "propertyNames": {"pattern": PRINTABLE_PATTERN},
     "additionalProperties": {"$ref": "#/components/schemas/TagValue"}},
]}


def _numbers_in_range(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, int | float) and not isinstance(v, bool) and not (
                NUMBER_MIN <= v <= NUMBER_MAX):
            return False
    return True


def _loggable(most: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A check of free-form JSON (tags, metadata): the trajectory log and the stores can
    write it as is, in at most `most` bytes."""

    def check(value: dict[str, Any]) -> dict[str, Any]:
        if not _numbers_in_range(value):
            raise ValueError("numbers must be within 64 bits (-2**63 .. 2**63-1)")
        try:
            size = len(orjson.dumps(value))
        except (TypeError, ValueError):
            raise ValueError("must be JSON of at most 250 levels of nesting, in valid "
                             "Unicode") from None
        if size > most:
            raise ValueError(f"is {size} bytes as JSON; at most {most}")
        return value

    return check


def whole(value: Any) -> Any:
    """12.0 is a whole number of turns, as JSON Schema's integer type says; 12.5, "12" and
    true are not (the strict check that follows refuses them)."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


Turns = Annotated[int, Field(ge=1, le=TURNS_MAX, strict=True), BeforeValidator(whole)]
# A token budget: a whole positive count, within what headers and stores take.
Tokens = Turns
# A cost or a time: a positive finite JSON number (true and "1.5" are not numbers).
Amount = Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)]
_OBJECT = {"type": "object", "additionalProperties": {"$ref": "#/components/schemas/JsonValue"}}
_TAGS = {"type": "object", "propertyNames": {"pattern": PRINTABLE_PATTERN},
         "additionalProperties": {"$ref": "#/components/schemas/TagValue"}}


def _json_object(most: int, schema: dict[str, Any] = _OBJECT) -> Any:
    return Annotated[dict[str, Any], AfterValidator(_loggable(most)), WithJsonSchema(schema)]


class EpisodeCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # (checked by checked_episode_id, for its own error code; the pattern is for readers)
    episode_id: str | None = Field(None, json_schema_extra={"pattern": EPISODE_ID_PATTERN})
    budget: Turns | None = None
    max_turns: Turns | None = None
    task_id: str | None = Field(None, max_length=TASK_ID_MAX_CHARS, pattern=PRINTABLE_PATTERN)
    group: str | None = Field(None, max_length=GROUP_MAX_CHARS, pattern=PRINTABLE_PATTERN)
    disclosure: Literal["hidden", "disclosed"] | None = None
    announced_budget: Turns | None = None
    min_turns: Turns | None = None  # the task's fewest turns (analyze --ceiling)
    tags: _json_object(TAGS_MAX_BYTES, _TAGS) = Field(  # type: ignore[valid-type]
        default_factory=dict)
    # budgets beside turns (core.axes, docs/budgets.md)
    token_budget: Tokens | None = None
    cost_budget: Amount | None = None
    time_budget_s: Amount | None = None
    announced_tokens: Tokens | None = None
    announced_cost: Amount | None = None
    announced_time_s: Amount | None = None
    # a live experiment to join (docs/experiments.md): the proxy assigns and applies its arm
    experiment: str | None = Field(None, pattern=NAME_PATTERN)


class OutcomeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    success: StrictBool
    reward: float | None = Field(None, allow_inf_nan=False, strict=True)
    success_turn: Turns | None = None
    metadata: _json_object(METADATA_MAX_BYTES) = Field(  # type: ignore[valid-type]
        default_factory=dict)
