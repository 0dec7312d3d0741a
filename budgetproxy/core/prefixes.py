"""What an episode's next turn takes from its previous one: the conversation as that turn
wrote it, where its digest's hash ended, and whether its body was read without loss.

A long episode resends its whole history every turn. Most of what the proxy does with a
conversation (its digest, the check for integers orjson read as floats) needs only the
messages a turn adds, once it is known that the others are, byte for byte, the ones the
previous turn sent. That is one write of the conversation (orjson, in C) and one
comparison of bytes: the previous turn's conversation, without its closing bracket, must
start this one's, and a message boundary (`,`) must follow it. Equal bytes are equal
values as the proxy reads them (an integer and a float, or `true` and `1`, are written
differently), so a turn that passes the check would compute the same digest and find the
same values from scratch; the differential tests hold it to that.

Kept per process for the episodes that called last, up to `max_bytes` of conversations; a
turn whose episode is not here (the first one a replica sees, or one pushed out) does the
whole work.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson

from budgetproxy.core.disclosure import Disclosed
from budgetproxy.core.fingerprint import Fingerprint, Tail, canonical

# What is kept across an episode's turns, in bytes as `_size` counts them: ~90 chat episodes of
# 400 turns of 400-character messages (345 KB each, with their placed messages), or tens of
# thousands of short ones.
MAX_BYTES = 64 << 20


class Raw(NamedTuple):
    """A turn's body as the client wrote it up to its last message, for a dialect whose
    conversation is not the body's own list (Messages: its cache markers left out, which
    clients move every turn): a next turn whose body starts with the same bytes takes the
    conversation's entries for them from this turn's, instead of reading them again."""

    head: bytes  # as the dialect writes it, up to (not including) the last message
    messages: int  # the messages the head holds: all but the last
    conversation: list[Any]  # the turn's conversation (its first entries are those messages')
    last: int  # the length of the conversation's last entry as orjson writes it


class SentBody:
    """The messages the upstream got on a disclosed turn, as orjson writes them (`items`, a
    JSON array of `count` of them; `items[:cut]` all but the last, without its comma): a next
    turn whose placed messages start with all of these, or all but the last (the same
    objects), copies their bytes instead of writing them again (proxy/spliced.py). Filled
    once the turn's body is written (None: it was not)."""

    __slots__ = ("items", "count", "cut")

    def __init__(self) -> None:
        self.items: bytes | None = None
        self.count = 0
        self.cut = 0


class Prefix(NamedTuple):
    """A turn's conversation, for its episode's next turn to compare with."""

    written: bytes  # the conversation as orjson writes it
    messages: int  # how many messages it holds
    # its digest and where that digest's hash ended (core.fingerprint; the hash state is
    # kept for long ones only: `state` None)
    tail: Tail | None
    lossless: bool  # its body was checked and held no integer orjson read as a float
    placed: Disclosed | None = None  # its messages with their texts (core.disclosure.placed_last)
    turn: int = 0  # its turn and attempt (0: not known)
    attempt: int = 0
    plain: bool = False  # the upstream got its conversation as the client sent it (no text)
    as_written: bool = False  # its canonical bytes are `written` (no message in another shape)
    raw: Raw | None = None  # its body up to its last message, for a dialect that keeps one
    # its conversation, sent as the client wrote it, held a float orjson read an integer past
    # 64 bits as (a next turn that starts with it holds that float too)
    lossy: bool = False
    sent: SentBody | None = None  # the body its upstream got, with its texts placed


# What a kept Prefix holds beside its conversation's bytes, as counted against the limit
# (measured by RSS, tests/core/test_prefixes.py): the tuple, its digest and so on; a BLAKE3
# state (kept for conversations of at least TAIL_FROM bytes, and for those with a message in
# another shape: below that, hashing the whole again costs a few microseconds); and, with
# placed messages, the objects of each (the turn's parse and the copy with its text) and
# their text.
_ENTRY = 512
_STATE = 4096
_PER_MESSAGE = 480
TAIL_FROM = 1 << 15


def _size(prefix: Prefix) -> int:
    """A kept Prefix's bytes as the limit counts them."""
    size = len(prefix.written) + _ENTRY
    if prefix.raw is not None:
        size += len(prefix.raw.head) + _PER_MESSAGE * len(prefix.raw.conversation)
    if prefix.tail is not None and prefix.tail.state is not None:
        size += _STATE
    if prefix.placed is not None:
        size += len(prefix.written) + _PER_MESSAGE * len(prefix.placed.messages)
    if prefix.sent is not None:  # (filled after this count: its texts' bytes are left out)
        size += len(prefix.written)
    return size


def written(conversation: list[Any], earlier: Prefix | None = None,
            entries: int = 0) -> bytes | None:
    """The conversation as orjson writes it; None when it cannot (nesting past 254 levels).
    With `earlier`, whose `Raw` conversation's first `entries` are this one's (the same
    objects), and all but the last of its entries: their bytes are taken from its `written`,
    and only the others written (a long conversation is not written whole every turn)."""
    try:
        raw = None if earlier is None else earlier.raw
        if earlier is not None and raw is not None and (
                0 < entries == len(raw.conversation) - 1 < len(conversation)):
            # `[e0,...,e(n-1),` of its bytes, then `e(n),...]`: the bytes orjson would write
            cut = len(earlier.written) - 1 - raw.last
            return earlier.written[:cut] + orjson.dumps(conversation[entries:])[1:]
        return orjson.dumps(conversation)
    except (TypeError, ValueError):
        return None


def starts_with(written_now: bytes, head: bytes | memoryview) -> bool:
    """Whether the JSON array `written_now` starts with every item of the array whose bytes,
    without their closing bracket, are `head`, and has more: items delimit themselves, so its
    bytes start with `head` and a `,` follows."""
    n = len(head)
    return len(written_now) > n + 1 and written_now[n] == 0x2C and written_now.startswith(head)


def extended(previous: Prefix | None, written_now: bytes | None) -> Prefix | None:
    """`previous` when the conversation written as `written_now` starts with its messages,
    byte for byte, and has more; None otherwise."""
    if previous is None or written_now is None or previous.messages < 1:
        return None
    head = memoryview(previous.written)[:-1]  # (all but its closing bracket)
    return previous if starts_with(written_now, head) else None


def fingerprint(previous: Prefix | None, conversation: list[Any],
                written_now: bytes) -> Fingerprint:
    """The digests of the conversation written as `written_now`, which starts with the
    `previous` turn's (`extended`) when that is given. Only what is new is looked at where it
    can be: hashed on from a long conversation's kept hash state; or, when no message of the
    previous turn's was in another shape, only the new messages' shapes looked at, and the
    bytes already written hashed as they are."""
    tail = None if previous is None else previous.tail
    if tail is not None and tail.state is not None:
        assert previous is not None
        prints = Fingerprint.extending(conversation, tail, previous.messages)
        if prints is not None:
            return prints
    if tail is not None and previous is not None and previous.as_written:
        new = conversation[previous.messages:]
        if canonical(new) is new:
            return Fingerprint.written(conversation, written_now, tail.digest)
    elif canonical(conversation) is conversation:
        return Fingerprint.written(conversation, written_now, None)
    return Fingerprint(conversation)


def kept_tail(prints: Fingerprint, written_now: bytes) -> Tail:
    """What a turn keeps of its digest for the next: the hash state only of a conversation
    long enough that hashing it again would cost more than keeping it (`TAIL_FROM`), or of one
    with a message in another shape (its next turn would otherwise look at every message's
    shape again, not only the new ones': Claude Code's first prompt, after its first turn)."""
    tail = prints.tail()
    if len(written_now) >= TAIL_FROM or not prints.as_written:
        return tail
    return Tail(tail.length, None, tail.digest)


class CheckedOthers:
    """A body's values but its conversation's list (a Messages call's tools and system
    prompt), as orjson writes them, that a check for integers read as floats looked at and
    found none in (proxy/wire.py `Checked`): a later body whose other values are these bytes
    holds none either, in whichever episode. An agent sends the same tools with every call
    of every episode, so they are looked at once per process, not on each episode's first
    turns. At most `max_entries`, one per length (a lookup is one comparison of bytes), each
    at most `max_bytes` (8 MiB in all by default)."""

    def __init__(self, max_entries: int = 32, max_bytes: int = 256 << 10) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._by_length: dict[int, bytes] = {}

    def __contains__(self, others: bytes) -> bool:
        return self._by_length.get(len(others)) == others

    def add(self, others: bytes) -> None:
        if len(others) > self.max_bytes:
            return
        table = self._by_length
        table.pop(len(others), None)
        table[len(others)] = others  # (the newest last; the oldest goes first)
        if len(table) > self.max_entries:
            del table[next(iter(table))]


class Prefixes:
    """The last turn's `Prefix` of recent episodes, at most `max_bytes` of conversations;
    the episode that called least recently is dropped first."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._last: dict[str, Prefix] = {}  # in order of use (re-inserted on each)
        self._sizes: dict[str, int] = {}  # their sizes as counted
        self._bytes = 0
        self.others = CheckedOthers()  # (shared by every episode)

    def get(self, episode_id: str) -> Prefix | None:
        return self._last.get(episode_id)

    def keep(self, episode_id: str, prefix: Prefix) -> None:
        """`prefix` as the episode's last turn (replacing the one before)."""
        self.drop(episode_id)
        size = _size(prefix)
        if size > self.max_bytes:
            return
        self._last[episode_id] = prefix
        self._sizes[episode_id] = size
        self._bytes += size
        while self._bytes > self.max_bytes:
            self.drop(next(iter(self._last)))

    def drop(self, episode_id: str) -> None:
        if self._last.pop(episode_id, None) is not None:
            self._bytes -= self._sizes.pop(episode_id)

    @property
    def size(self) -> int:
        """Bytes kept, as the limit counts them."""
        return self._bytes
