"""A disclosed turn's upstream body written from the previous turn's: only what is new is
written.

On the disclosed arm (`history: keep`, `last_message`) a turn's placed messages start with the
previous turn's placed messages, the same objects (core/disclosure.py `placed_last`, its
`base`; on the Messages API all but the last, whose cache marker the client moves), so the
payload the upstream gets is the previous one's with messages added. orjson
writes an array as its items in order, each written alone: the bytes of those first messages
in the previous body are the bytes orjson would write for them now. So the messages are the
previous ones' bytes with the new items' after them, put in the body as written JSON (an
`orjson.Fragment`): byte for byte `orjson.dumps(payload)` (the differential tests hold it to
that), without reading again the objects a long episode made turns ago.
"""

from __future__ import annotations

from typing import Any

import orjson

from budgetproxy.core.prefixes import SentBody

_KEY = "messages"
_WRAP = len(b'{"messages":')


def _array(items: list[Any]) -> bytes:
    """orjson's writing of `items` as they sit in the body, one level down: written inside an
    object as they are there, so that what nests past orjson's limit in the body is refused
    here too (a Fragment's bytes are not looked into)."""
    return orjson.dumps({_KEY: items})[_WRAP:-1]


def spliced(payload: dict[str, Any], base: int, previous: SentBody | None,
            into: SentBody) -> bytes | None:
    """`orjson.dumps(payload)`, whose messages' first `base` items are the ones whose bytes
    `previous` holds, those bytes copied from it (None: it holds none, or other ones); its
    messages' bytes kept in `into` for the next turn."""
    items = payload.get(_KEY)
    held = None if previous is None else previous.items
    if held is None or previous is None or base < 1 or (
            type(items) is not list or len(items) <= base):
        return None
    if base == previous.count:
        end = len(held) - 1
    elif base == previous.count - 1 and previous.cut:
        end = previous.cut
    else:
        return None
    try:
        new = _array(items[base:])
        last = len(orjson.dumps(items[-1:])) if len(items) - base > 1 else len(new)
        messages = b"".join((memoryview(held)[:end], b",", memoryview(new)[1:]))
        body = orjson.dumps({**payload, _KEY: orjson.Fragment(messages)})
    except (TypeError, ValueError):  # (what orjson cannot write: the caller's way)
        return None
    into.items, into.count, into.cut = messages, len(items), len(messages) - last
    return body


def written(payload: dict[str, Any], into: SentBody) -> bytes | None:
    """`orjson.dumps(payload)`, its messages' bytes kept in `into` for the next turn (None:
    orjson cannot write it)."""
    items = payload.get(_KEY)
    if type(items) is not list or not items:
        return None
    try:
        messages = _array(items)
        last = len(orjson.dumps(items[-1:]))
        body = orjson.dumps({**payload, _KEY: orjson.Fragment(messages)})
    except (TypeError, ValueError):
        return None
    # (a copy: orjson's output may sit in a block up to twice its length)
    into.items, into.count = bytes(memoryview(messages)), len(items)
    into.cut = len(messages) - last if len(items) > 1 else 0
    return body
