"""Disclosure: render the remaining-budget text and place it in the conversation."""

from __future__ import annotations

import functools
import string
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, NamedTuple

from budgetproxy.core.episode import Placed
from budgetproxy.core.fingerprint import Fingerprint, lone_text

Placement = Literal["last_message", "system", "new_message"]


# The axis fields a template may use beside {turn} {total} {remaining} {used} (core.axes).
AXIS_FIELDS = tuple(f"{axis}_{part}" for axis in ("tokens", "cost", "seconds")
                    for part in ("remaining", "total", "used"))
_NO_AXES = dict.fromkeys(AXIS_FIELDS, "n/a")


class _Lenient(string.Formatter):
    """str.format, except that a format spec a value cannot take ("n/a" under {x:.2f}) gives
    the plain value instead of an error."""

    def format_field(self, value: Any, format_spec: str) -> str:
        try:
            return format(value, format_spec)
        except (TypeError, ValueError):
            return str(value)


_FORMATTER = _Lenient()


@functools.lru_cache(maxsize=64)
def uses_axes(template: str) -> bool:
    return any(a in template for a in ("{tokens_", "{cost_", "{seconds_"))


def render(template: str, turn: int, budget: int, announced_budget: int | None,
           fields: Mapping[str, Any] | None = None) -> str:
    total = announced_budget if announced_budget is not None else budget
    if fields is None and not uses_axes(template):
        return _render_turns(template, turn, total)
    values = _turn_values(turn, total)
    return _FORMATTER.format(template, **values, **(_NO_AXES if fields is None else fields))


def _turn_values(turn: int, total: int) -> dict[str, Any]:
    remaining = max(0, total - turn)
    turns_remain = "1 turn remains" if remaining == 1 else f"{remaining} turns remain"
    return {"turn": turn, "total": total, "remaining": remaining, "used": turn - 1,
            "turns_remain": turns_remain}


@functools.lru_cache(maxsize=4096)
def _render_turns(template: str, turn: int, total: int) -> str:
    """A text with turn fields only: the same for every episode at that turn of that total,
    so most turns find it already written."""
    return template.format(**_turn_values(turn, total))


_TURN_TEXTS_KEPT = 8192  # texts kept per (template, total) before they are written again


@functools.lru_cache(maxsize=256)
def _turn_texts(template: str, total: int) -> dict[int, str]:
    """The texts of a turn-only template for one total, by turn, as they are written: a long
    episode re-applies every earlier turn's text on each call (history: keep)."""
    return {}


def _earlier_texts(template: str, total: int, chosen: list[tuple[int, int]]
                   ) -> list[tuple[int, str]]:
    """(index, text) for (index, turn) pairs, with a turn-only template."""
    if not chosen:
        return []
    kept = _turn_texts(template, total)
    if len(kept) > _TURN_TEXTS_KEPT:
        kept.clear()
    text_of = kept.__getitem__
    try:  # (a long episode re-applies every earlier turn's text on each call)
        return [(index, text_of(turn)) for index, turn in chosen]
    except KeyError:  # (only the turns not yet written: the set's difference is taken in C)
        for turn in {turn for _, turn in chosen}.difference(kept):
            kept[turn] = template.format(**_turn_values(turn, total))
        return [(index, text_of(turn)) for index, turn in chosen]


def disclose(
    messages: list[Any], template: str, placement: Placement, turn: int, budget: int,
    announced_budget: int | None, earlier: Iterable[Placed] = (),
    conversation: Fingerprint | None = None,
) -> tuple[str, list[Any]]:
    """This turn's text, and the messages with it placed. With `conversation` (the digests of
    `messages`; history: keep), the `earlier` placements this conversation still extends are
    re-applied with their own turns' texts."""
    text = render(template, turn, budget, announced_budget)
    again: list[tuple[int, str]] = []
    if conversation is not None:
        again = [(idx, render(template, t, budget, announced_budget))
                 for idx, t in replayable(earlier, conversation)]
    return text, apply(messages, placement, text, again)


def texts(
    template: str, turn: int, budget: int, announced_budget: int | None,
    earlier: Iterable[Placed] = (), conversation: Fingerprint | None = None,
    fields: Mapping[str, Any] | None = None, told: Mapping[str, str] | None = None,
    chosen: list[tuple[int, int]] | None = None,
) -> tuple[str, list[tuple[int, str]]]:
    """This turn's text, and (index, text) of the `earlier` placements to re-apply where
    `conversation` (history: keep; None: drop) still extends the turn they were made in.

    `fields` are the axis fields (core.axes) as this turn starts; `told` the texts earlier
    turns were given with theirs (by turn), re-applied as they were. `chosen`: the (index,
    turn) to re-apply, already chosen (core.replays), instead of `earlier` and
    `conversation`."""
    text = render(template, turn, budget, announced_budget, fields)
    if chosen is None:
        if conversation is None:
            return text, []
        chosen = replayable(earlier, conversation)
    if not told and fields is None and not uses_axes(template):
        total = announced_budget if announced_budget is not None else budget
        # This turn's text joins the table its next turns re-apply it from: a turn's earlier
        # texts are then all found there, and none is written again.
        _turn_texts(template, total)[turn] = text
        return text, _earlier_texts(template, total, chosen)
    told = told or {}
    return text, [(idx, told.get(str(t)) or render(template, t, budget, announced_budget,
                                                   fields))
                  for idx, t in chosen]


def placement_index(placement: Placement, message_count: int) -> int | None:
    """The client-message index a turn's text attaches to; None for `system` (not replayed)."""
    if placement == "last_message":
        return message_count - 1
    if placement == "new_message":
        return message_count  # inserted before the client message at this index
    return None


def replayable(placed: Iterable[Placed], conversation: Fingerprint) -> list[tuple[int, int]]:
    """(index, turn) of the earlier placements to re-apply (history: keep): those whose turn's
    conversation this one still extends. A client that shrank, summarised or edited its
    history gets none of the texts placed before the change, as with history: drop."""
    placed = list(placed)
    keep = conversation.extends_each([digest for _, _, _, digest in placed])
    return [(idx, turn) for (idx, turn, _, _), ok in zip(placed, keep, strict=True) if ok]


def _after_tool_replies(messages: list[Any], index: int) -> int:
    """The first index at or after `index` that is not a tool reply: a message inserted
    there never parts an assistant's tool calls from their replies (which the API refuses)."""
    while index < len(messages) and isinstance(messages[index], dict) and (
        messages[index].get("role") == "tool"
    ):
        index += 1
    return index


def joined(content: list[Any], text: str) -> list[Any] | None:
    """Content that is one text block with `text` appended to its text as to a string's
    ("\n\n" + text), the block's other keys kept; None for other content. A client that
    flips a message between a string and one text block then sends the same text either way,
    and the upstream's prompt stays append-only across the flip."""
    lone = lone_text(content)
    if lone is None:
        return None
    return [{**content[0], "text": lone + "\n\n" + text if lone else text}]


def _append_text(message: dict[str, Any], text: str) -> dict[str, Any]:
    out = dict(message)
    content = message.get("content")
    if type(content) is str and content:  # most messages: checked first
        out["content"] = f"{content}\n\n{text}"
        return out
    one = joined(content, text) if isinstance(content, list) else None
    if one is not None:
        out["content"] = one
    elif isinstance(content, list):
        out["content"] = [*content, {"type": "text", "text": text}]
    elif isinstance(content, str) and content:
        out["content"] = content + "\n\n" + text
    else:
        out["content"] = text
    return out


class Disclosed(NamedTuple):
    """A turn's conversation with its texts placed at its last message (`placed_last`), and
    the texts in the order they went on: its episode's next turn starts from it."""

    messages: list[Any]
    texts: list[tuple[int, str]]  # (index, text): earlier turns', then its own
    base: int = 0  # how many of its messages are the previous turn's placed ones


def placed_last(
    messages: list[Any], text: str, earlier: list[tuple[int, str]],
    previous: Disclosed | None = None,
) -> tuple[list[Any], Disclosed | None]:
    """`apply` with `last_message`, and what the next turn may start from (None when a text
    could not go on its message). With `previous`, the episode's previous turn's, whose
    messages the caller knows to be, byte for byte, this conversation's first ones: when
    its texts begin `earlier`, its placed messages are taken as they are, and only the new
    messages are copied and given texts (a long episode re-applies a text to every earlier
    turn's message)."""
    n = len(messages)
    out: list[Any] | None = None
    rest = earlier
    base = 0
    if previous is not None:
        m, k = len(previous.texts), len(previous.messages)
        if k < n and earlier[:m] == previous.texts:  # (all its texts went on their messages)
            out, rest, base = [*previous.messages, *messages[k:]], earlier[m:], k
    if out is None:
        out = list(messages)
    whole = True
    for idx, old in rest:
        if 0 <= idx < n - 1 and isinstance(out[idx], dict):
            out[idx] = _append_text(out[idx], old)
        else:
            whole = False
    out[n - 1] = _append_text(out[n - 1], text)
    if not whole:
        return out, None
    # (rest: texts placed on the new messages only, or none: the previous turn's stand)
    return out, Disclosed(out, [*earlier, (n - 1, text)],
                          base if all(idx >= base for idx, _ in rest) else 0)


def apply(
    messages: list[Any],
    placement: Placement,
    text: str,
    earlier: Iterable[tuple[int, str]] = (),
) -> list[Any]:
    """A new message list with this turn's text placed, and earlier turns' texts re-applied.

    `earlier` holds (index, text) of previous turns (history: keep, see `replayable`); indices
    outside the conversation are skipped. A `new_message` text goes back before the message
    at its index, or after the tool replies that follow there (the turn it was placed in
    had only some of them). Messages not touched are the client's own objects, so nothing
    but the placements changes.
    """
    n = len(messages)
    if placement == "system":
        for i, m in enumerate(messages):
            if isinstance(m, dict) and m.get("role") == "system":
                return [*messages[:i], _append_text(m, text), *messages[i + 1 :]]
        return [{"role": "system", "content": text}, *messages]
    if placement == "last_message":
        out = list(messages)
        for idx, old in earlier:
            if 0 <= idx < n - 1 and isinstance(out[idx], dict):
                out[idx] = _append_text(out[idx], old)
        out[n - 1] = _append_text(out[n - 1], text)
        return out
    inserts: dict[int, list[str]] = {}
    for idx, old in sorted(earlier, key=lambda e: e[0]):
        if 0 <= idx < n:
            inserts.setdefault(_after_tool_replies(messages, idx), []).append(old)
    inserts.setdefault(n, []).append(text)
    out = []
    for i in range(n + 1):
        for t in inserts.get(i, ()):
            out.append({"role": "user", "content": t})
        if i < n:
            out.append(messages[i])
    return out


def edit(
    items: list[Any],
    appends: dict[int, list[str]],
    inserts: dict[int, list[str]],
    append: Callable[[Any, str], Any],
    new: Callable[[str], Any],
) -> list[Any]:
    """A new item list with texts appended to items (`appends`: index -> texts, in order) and
    new items inserted before an index (`inserts`; index len(items) is the end). What other
    APIs than chat completions need: each says how a text is appended and what a new item is.
    Items not touched are the client's own objects. (A long episode's calls re-apply a text
    to every earlier turn: the work follows the texts, not the items.)"""
    edited = items.copy()
    n = len(items)
    for i, texts in appends.items():
        if not 0 <= i < n:
            continue
        item = items[i]
        for t in texts:
            item = append(item, t)
        edited[i] = item
    if not inserts:
        return edited
    out: list[Any] = []
    start = 0
    for i in sorted(inserts):
        if not 0 <= i <= n:
            continue
        out += edited[start:i]
        out += [new(t) for t in inserts[i]]
        start = i
    out += edited[start:]
    return out
