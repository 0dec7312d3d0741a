"""What a model call carries: routes, payload checks, episode headers, the reply read back."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import orjson

from budgetproxy.core.budget import TURNS_MAX
from budgetproxy.core.episode import EpisodeState
from budgetproxy.core.spec import EpisodeSpec
from budgetproxy.errors import invalid_request

MODEL_ROUTES: dict[str, str] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
}
DROP_RESPONSE_HEADERS = frozenset(
    {
        "content-length", "content-encoding", "transfer-encoding", "connection", "keep-alive",
        "date", "server",
    }
)
_SPEC_HEADERS = {
    "budget": b"x-episode-budget",
    "max_turns": b"x-episode-max-turns",
    "announced_budget": b"x-episode-announced-budget",
    "min_turns": b"x-episode-min-turns",
}


def _shown(raw: bytes) -> str:
    """A header value as an error message quotes it: UTF-8 where it is (clients send it),
    other bytes as escapes."""
    return raw.decode("utf-8", "backslashreplace")


def _int_header(headers: dict[bytes, bytes], name: bytes, param: str) -> int | None:
    raw = headers.get(name)
    if raw is None or raw == b"":
        return None
    digits = raw.strip()
    if not digits.isdigit():  # bytes.isdigit: ASCII digits only (no sign, "_" or spaces)
        raise invalid_request(
            f"Header {name.decode().title()} must be a positive integer, "
            f"got {_shown(raw)!r}", param)
    value = int(digits)
    if not 1 <= value <= TURNS_MAX:
        raise invalid_request(
            f"Header {name.decode().title()} must be between 1 and {TURNS_MAX}", param)
    return value


def _float_header(headers: dict[bytes, bytes], name: bytes, param: str) -> float | None:
    raw = headers.get(name)
    if raw is None or raw == b"":
        return None
    try:
        value = float(raw.strip().decode("latin-1"))
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise invalid_request(
            f"Header {name.decode().title()} must be a positive number, "
            f"got {_shown(raw)!r}", param)
    return value


# First-call headers of the budgets beside turns: (header, EpisodeSpec field, is a count).
_AXIS_HEADERS = (
    (b"x-episode-token-budget", "token_budget", True),
    (b"x-episode-cost-budget", "cost_budget", False),
    (b"x-episode-time-budget", "time_budget_s", False),
    (b"x-episode-announced-tokens", "announced_tokens", True),
    (b"x-episode-announced-cost", "announced_cost", False),
    (b"x-episode-announced-time", "announced_time_s", False),
)


def _axis_fields(headers: dict[bytes, bytes]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, param, count in _AXIS_HEADERS:
        if name in headers:
            value = (_int_header if count else _float_header)(headers, name, param)
            if value is not None:
                out[param] = value
    return out


def _text_header(headers: dict[bytes, bytes], name: bytes, param: str) -> str | None:
    raw = headers.get(name)
    if not raw:
        return None
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise invalid_request(f"Header {name.decode().title()} must be UTF-8 text",
                              param) from None


def spec_from_headers(episode_id: str, headers: dict[bytes, bytes]) -> EpisodeSpec:
    arm_raw = headers.get(b"x-episode-disclosure")
    arm = arm_raw.decode("latin-1").strip().lower() if arm_raw else None
    if arm not in (None, "hidden", "disclosed"):
        raise invalid_request(
            f"Header X-Episode-Disclosure must be 'hidden' or 'disclosed', got {arm!r}",
            "disclosure",
        )
    task = _text_header(headers, b"x-episode-task", "task_id")
    group = _text_header(headers, b"x-episode-group", "group")
    return EpisodeSpec(
        episode_id=episode_id,
        budget=_int_header(headers, _SPEC_HEADERS["budget"], "budget"),
        max_turns=_int_header(headers, _SPEC_HEADERS["max_turns"], "max_turns"),
        announced_budget=_int_header(
            headers, _SPEC_HEADERS["announced_budget"], "announced_budget"
        ),
        min_turns=_int_header(headers, _SPEC_HEADERS["min_turns"], "min_turns"),
        task_id=task,
        group=group,
        disclosure=arm,  # type: ignore[arg-type]
        **_axis_fields(headers),
    )


# First-call headers a later call may resend (SDKs send default headers on every call), and
# the episode field each sets. A later copy never changes the episode; one that differs is
# named in the answer's X-Episode-Warning.
_FIRST_CALL_FIELDS = (
    (b"x-episode-budget", "budget"),
    (b"x-episode-max-turns", "max_turns"),
    (b"x-episode-announced-budget", "announced_budget"),
    (b"x-episode-min-turns", "min_turns"),
    (b"x-episode-task", "task_id"),
    (b"x-episode-group", "group"),
    (b"x-episode-disclosure", "disclosure"),
)
_FIRST_CALL_NAMES = frozenset(name for name, _ in _FIRST_CALL_FIELDS)
_COUNT_FIELDS = frozenset({"budget", "max_turns", "announced_budget", "min_turns"})


def ignored_spec_headers(headers: dict[bytes, bytes], st: EpisodeState) -> bytes | None:
    """The X-Episode-Warning of a later call whose first-call headers differ from what its
    episode holds (those headers are read on the first call only), or None when none do."""
    if _FIRST_CALL_NAMES.isdisjoint(headers):  # (most calls: none sent again)
        return None
    ignored: list[str] = []
    for name, attr in _FIRST_CALL_FIELDS:
        raw = headers.get(name)
        if not raw:
            continue
        held = getattr(st, attr)
        sent = raw.decode("utf-8", "replace").strip()
        if name == b"x-episode-disclosure":
            sent = sent.lower()
        elif attr in _COUNT_FIELDS and sent.isascii() and sent.isdigit():  # "08" is 8
            sent = sent.lstrip("0") or "0"  # (no int(): thousands of digits would raise)
        if held is None or sent != str(held):
            shown = "none" if held is None else str(held)
            shown_sent = sent if len(sent) <= 64 else sent[:64] + "..."
            ignored.append(f"{name.decode().title()} {shown_sent!r} ignored: the episode's "
                           f"{attr} is {shown} (set on its first call)")
    if not ignored:
        return None
    # ASCII, anything else escaped: a header value any client reads back the same way
    return "; ".join(ignored).encode("ascii", "backslashreplace")


def parse_payload(body: bytes) -> dict[str, Any]:
    """A model call's body: a JSON object with a non-empty string `model` and, if given, a
    boolean `stream` (what every API needs; each dialect checks its own fields)."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise invalid_request(f"Request body is not valid JSON: {e}") from None
    if not isinstance(payload, dict):
        raise invalid_request("Request body must be a JSON object")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise invalid_request("'model' is required and must be a non-empty string", "model")
    stream = payload.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise invalid_request("'stream' must be a boolean", "stream")
    return payload


# orjson reads an integer outside [-2**63, 2**64) as a float; only such floats can stand for one.
_LOSSY_FLOAT = float(1 << 63)


class Checked(NamedTuple):
    """What an earlier check of the body proves of this one: its conversation's first
    `entries` are, byte for byte, those of a conversation whose body held no float
    an integer past 64 bits became (the episode's previous turn's, core/prefixes.py)."""

    conversation: list[Any]
    entries: int
    items_key: str | None  # the payload's list the conversation's messages come from
    heads: int  # conversation entries before them (instructions, system prompt)
    # the payload's other values (`others`) are, as orjson writes them, those of that turn,
    # whose check found none (a Messages call's tools and system prompt: the same every turn)
    others_checked: bool = False
    # the payload's first items are, as the dialect writes them, that turn's (its `Raw`)
    items_proven: int = 0


def others(payload: dict[str, Any], items_key: str | None) -> list[Any]:
    """The payload's values but the list the conversation's messages come from, in order."""
    return [v for k, v in payload.items() if k != items_key]


def exact_payload(body: bytes, payload: dict[str, Any],
                  checked: Checked | None = None) -> tuple[dict[str, Any] | None, bool]:
    """The body read again keeping every integer exact, when orjson's reading of it (the
    `payload`) turned one past 64 bits into a float (None when that reading is exact, or the
    standard library cannot read the body: nesting past its depth); and whether such a float
    was found (a turn that found one never stands for the next turn's check, whether or not
    it could be read again).

    Only a body the proxy re-encodes needs this (a seed, or a schema default, must reach the
    upstream as sent); one that is forwarded as is keeps its bytes anyway. The check walks
    the parsed values, not the bytes: its cost follows the number of values, not the size of
    the texts and images they carry. With `checked`, the payload's items that are (the same
    objects as) entries of the conversation's checked part are not walked again, nor its other
    values when they are checked (`others_checked`).
    """
    if not _has_lossy_float(_unchecked(payload, checked)):
        return None, False
    # (None when deeper than the stdlib parser goes: orjson's reading is kept)
    return read_exact(body), True


def _unchecked(payload: dict[str, Any], checked: Checked | None) -> list[Any]:
    """The containers of `payload` an earlier check does not cover. An item of the payload's
    list that is itself a checked conversation entry holds exactly that entry's values; any
    other item (one whose markers the conversation leaves out, say) is walked."""
    key = None if checked is None else checked.items_key
    items = None if key is None else payload.get(key)
    if checked is None or type(items) is not list:
        return [payload]
    conversation, heads = checked.conversation, checked.heads
    n = max(0, min(checked.entries - heads, len(items), len(conversation) - heads))
    rest = [] if checked.others_checked else others(payload, key)
    if items is conversation and heads == 0:  # (chat: the payload's own list)
        return [rest, items[n:]]
    start = min(checked.items_proven, n)
    return [rest, items[n:],
            [m for i, m in enumerate(items[start:n], start) if conversation[heads + i] is not m]]


def has_lossy_float(values: Any) -> bool:
    """Whether a container orjson read holds a float an integer past 64 bits may have
    become."""
    return (type(values) is dict or type(values) is list) and _has_lossy_float([values])


def read_exact(body: bytes) -> dict[str, Any] | None:
    """`body` read by the standard library, every integer exact (None: it cannot be, as an
    object)."""
    try:
        exact = json.loads(body)
    except (RecursionError, ValueError):
        return None
    return exact if isinstance(exact, dict) else None


def _has_lossy_float(stack: list[Any]) -> bool:
    pop, push = stack.pop, stack.append
    while stack:
        container = pop()
        for value in container.values() if type(container) is dict else container:
            kind = type(value)
            if kind is str:  # most values: skipped first
                continue
            if kind is dict or kind is list:
                push(value)
            elif kind is float and not -_LOSSY_FLOAT < value < _LOSSY_FLOAT:
                return True
    return False


def encode_exact(payload: Any) -> bytes:
    """A payload from `exact_payload` (or values taken from one) written back: the standard
    library writes integers of any size, which orjson refuses. Raises ValueError or
    RecursionError when it cannot."""
    return json.dumps(payload, ensure_ascii=False, allow_nan=False,
                      separators=(",", ":")).encode()
