"""Conversation fingerprints: does a turn's conversation extend what an earlier turn sent?

Agents usually resend their whole history plus a few new messages, but some summarise,
truncate or edit it between turns. The log (new messages only) and history-keep disclosure
(earlier texts re-applied by index) are only right while the conversation grows append-only,
so each turn keeps a digest of the messages it sent, and a later turn checks that its own
conversation starts with exactly those.

The conversation is written once (orjson, one call), its bytes hashed once. A digest names the
byte length it covers ("<length>/<first 128 bits of the BLAKE3 hash>"): messages are JSON
objects, which delimit themselves, so a conversation starts with an earlier one's messages
exactly when its bytes start with that one's bytes (up to the earlier closing bracket) and a
message boundary follows.
Hash states kept every few kilobytes make the digest of any such prefix cheap. BLAKE3 rather
than SHA-256: a pass over a 345 KB conversation takes ~50 µs instead of ~220 µs, and a long
episode hashes its whole history every turn (`python bench/long_episodes.py`). Digests that
earlier versions kept ("<length>:<SHA-256>") are still compared, by hashing that prefix again.
A turn whose conversation starts, byte for byte, with the previous turn's (core/prefixes.py)
hashes on from where that turn's hash ended (`Tail`, `Fingerprint.extending`): its digest costs
its new messages, and the whole is written only if an older digest is asked about.

A message is written in its canonical shape first: content that is a list holding one text
block (whatever annotations the block carries, `cache_control` among them) is written as that
block's text, the string it means. Clients flip a message between the two shapes from turn to
turn (Claude Code does after its first prompt), which changes nothing the model reads.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, NamedTuple

import orjson
from blake3 import blake3

# bytes between kept hash states: ~6 per 200 KB conversation; BLAKE3 hashes 16 KB and more
# in one update several chunks at a time, which shorter strides lose (8 KB: 1.5x slower)
_STRIDE = 1 << 15


_TEXT_BLOCKS = frozenset({"text", "input_text"})
_SHAPED_KEYS = ("content", "output", "system")  # where a message or head keeps its content


def lone_text(content: Any) -> str | None:
    """The text of content that is a list holding one text block; None for anything else."""
    if type(content) is not list or len(content) != 1:
        return None
    block = content[0]
    if type(block) is not dict or block.get("type") not in _TEXT_BLOCKS:
        return None
    text = block.get("text")
    return text if type(text) is str else None


def _canonical_blocks(content: list[Any]) -> list[Any]:
    """Content blocks with each tool result's content in its canonical shape."""
    out: list[Any] | None = None
    for i, block in enumerate(content):
        if type(block) is dict and type(block.get("content")) is list:
            inner = _canonical_item(block)
            if inner is not block:
                if out is None:
                    out = list(content)
                out[i] = inner
    return content if out is None else out


def _canonical_item(item: dict[str, Any]) -> dict[str, Any]:
    changed: dict[str, Any] | None = None
    for key in _SHAPED_KEYS:
        value = item.get(key)
        if type(value) is not list:
            continue
        text = lone_text(value)
        new: Any = text if text is not None else _canonical_blocks(value)
        if new is not value:
            if changed is None:
                changed = dict(item)
            changed[key] = new
    if item.get("type") == "message":  # a Responses item says so; a bare message does not
        if changed is None:
            changed = dict(item)
        del changed["type"]
    return item if changed is None else changed


def canonical(messages: list[Any]) -> list[Any]:
    """The conversation with every message's content in its canonical shape (see above);
    messages already in it are the client's own objects."""
    out: list[Any] | None = None
    i = -1
    for m in messages:
        i += 1
        # Most messages of most turns are {role, content: str} or {role, content: [blocks]}
        # with no lone text and no nested content: nothing to change. Any other key set (a
        # Responses item's type, a tool output, the system head) is looked at.
        if type(m) is not dict:
            continue
        content = m.get("content")
        if len(m) == 2 and "role" in m:
            if type(content) is not list:
                continue
            lone = len(content) == 1
            for block in content:  # no lone text block, no block with a content list: as sent
                if type(block) is dict and (type(block.get("content")) is list or (
                        lone and block.get("type") in _TEXT_BLOCKS)):
                    break
            else:
                continue
        c = _canonical_item(m)
        if c is not m:
            if out is None:
                out = list(messages)
            out[i] = c
    return messages if out is None else out


def _conversation_bytes(messages: list[Any]) -> bytes:
    """The conversation as the proxy parsed it, in its canonical shape (`canonical`'s),
    written back (the same bytes every turn)."""
    try:
        return orjson.dumps(messages)
    except TypeError:  # an integer over 64 bits, or nesting past orjson's 254 levels
        pass
    try:
        return json.dumps(messages, ensure_ascii=False, separators=(",", ":")).encode()
    except (RecursionError, ValueError):
        # Too deep for either encoder: bytes no later turn can match, so such a conversation
        # always counts as changed (logged whole) instead of wrongly as unchanged.
        return b"[" + os.urandom(32).hex().encode() + b"]"


class Tail(NamedTuple):
    """Where a conversation's digest ends: a later turn whose conversation starts with the
    same messages hashes on from here (`Fingerprint.extending`)."""

    length: int  # the bytes the digest covers (all but the closing bracket)
    state: Any  # the BLAKE3 state after them (copied before any update)
    digest: str


class Fingerprint:
    """One conversation (a list of messages, as the client sent it), ready to be compared."""

    __slots__ = ("_messages", "_blob", "_states", "_digests", "_known", "_end", "as_written")

    def __init__(self, messages: list[Any]) -> None:
        self._messages = messages
        self._digests: dict[int, str] = {}
        # Digests already compared: a turn asks about the previous turn's twice (the history
        # its disclosure texts are re-applied on, and the messages its record leaves out).
        self._known: dict[str | None, bool] = {}
        self._blob: memoryview | None = None
        self._end: Tail | None = None
        # whether the canonical bytes are the messages as orjson writes them (no message
        # in another shape): a later turn that starts with these bytes needs to look only
        # at its new messages' shapes (`written`)
        self.as_written = False
        self._load()

    @classmethod
    def written(cls, messages: list[Any], blob: bytes, extends: str | None) -> Fingerprint:
        """The fingerprint of `messages` whose canonical bytes are `blob`, orjson's writing of
        them (the caller has seen that no message is in another shape), and that starts with
        the conversation whose digest is `extends`, if given (its bytes start this one's)."""
        self = cls.__new__(cls)
        self._messages, self._digests, self._end, self.as_written = messages, {}, None, True
        self._known = {} if extends is None else {extends: True}
        self._index(blob)
        return self

    @classmethod
    def extending(cls, messages: list[Any], tail: Tail, count: int) -> Fingerprint | None:
        """The fingerprint of `messages` whose first `count` messages are written exactly as
        the conversation `tail` was taken of: only the rest is written and hashed, and the
        whole is written only if a digest other than those two is asked about. None when
        the new messages cannot be written (the caller takes the whole conversation)."""
        if count < 1:
            return None
        new = messages[count:]
        end, state, digest = tail
        if new:
            try:
                part = orjson.dumps(canonical(new))
            except TypeError:
                return None
            state = state.copy()
            state.update(b",")  # "[a,b" + "," + "c,d": the bytes the whole would have
            state.update(memoryview(part)[1:-1])
            end += len(part) - 1
            digest = f"{end}/{state.hexdigest(16)}"
        self = cls.__new__(cls)
        self._messages, self._blob, self._states, self._digests = messages, None, [], {}
        self.as_written = False
        self._known = {tail.digest: True, digest: True}
        self._end = Tail(end, state, digest)
        return self

    def _load(self) -> None:
        """The conversation written whole, with hash states every `_STRIDE` bytes."""
        messages = self._messages
        shaped = canonical(messages)
        self.as_written = shaped is messages
        self._index(_conversation_bytes(shaped))

    def _index(self, blob: bytes) -> None:
        self._blob = memoryview(blob)
        end = len(blob) - 1  # what a digest covers: all but the closing bracket
        if end < _STRIDE:  # most turns: one pass over a few KB is cheaper than kept states
            self._states: list[Any] = []
            return
        h = blake3()
        states = [h.copy()]  # states[i]: the hash of the first i * _STRIDE bytes
        for start in range(0, end - _STRIDE + 1, _STRIDE):
            h.update(self._blob[start : start + _STRIDE])
            states.append(h.copy())
        self._states = states

    @property
    def messages(self) -> list[Any]:
        """The conversation, as given."""
        return self._messages

    def tail(self) -> Tail:
        """Where this conversation's digest ends, for the episode's next turn."""
        if self._end is None:
            self.digest()
        assert self._end is not None
        return self._end

    def digest(self) -> str:
        """The digest of the whole conversation, for later turns to compare with."""
        if self._end is not None:
            return self._end.digest
        blob = self._bytes()
        end = len(blob) - 1
        if not self._states and end not in self._digests:  # (most turns: one short pass)
            h = blake3(blob[:end])
            digest = self._digests[end] = f"{end}/{h.hexdigest(16)}"
            self._end = Tail(end, h, digest)
            return digest
        self._hash_prefixes([end])
        return self._digests[end]

    def _bytes(self) -> memoryview:
        if self._blob is None:
            self._load()
        assert self._blob is not None
        return self._blob

    def extends_each(self, digests: list[str | None]) -> list[bool]:
        """extends() for each of several digests (an episode's earlier placements), hashing
        the conversation once in order of length instead of up to a stride per digest."""
        known = self._known
        new = [d for d in digests if d not in known]
        if new:
            self._bytes()
            lengths = [self._boundary(d) for d in new]
            self._hash_prefixes([n for n in lengths if n is not None])
            for n, d in zip(lengths, new, strict=True):
                if n is not None and d is not None and d[len(str(n))] == ":":
                    known[d] = self._sha256_prefix(n) == d  # an earlier version's digest
                else:
                    known[d] = n is not None and self._digests[n] == d
        return [known[d] for d in digests]

    def _sha256_prefix(self, n: int) -> str:
        """The digest earlier versions kept of the first `n` bytes (SHA-256)."""
        return f"{n}:{hashlib.sha256(self._bytes()[:n]).hexdigest()[:32]}"

    def _hash_prefixes(self, lengths: list[int]) -> None:
        """Put the digests of the conversation's first `lengths` bytes in `_digests`: the
        missing ones in one pass, in order of length, from the nearest kept hash state."""
        digests, states, blob = self._digests, self._states, self._bytes()
        end = len(blob) - 1  # (a digest covers all but the closing bracket)
        h: Any = None
        at = 0
        for n in sorted({n for n in lengths if n not in digests}):
            if not states:  # a short conversation: each prefix hashed from the start
                h = blake3(blob[:n])
            else:
                i = min(n // _STRIDE, len(states) - 1)
                if h is None or i * _STRIDE > at:  # a kept state is nearer than where h is
                    h, at = states[i].copy(), i * _STRIDE
                h.update(blob[at:n])
                at = n
            # 128 bits of the hash: kept per turn in the store, where size adds up
            digests[n] = f"{n}/{h.hexdigest(16)}"
            if n == end:  # (the longest: h is not updated again)
                self._end = Tail(n, h, digests[n])

    def _boundary(self, digest: str | None) -> int | None:
        """The length a digest covers, if this conversation has a message boundary there:
        ',' (more messages) or ']' (no more) must follow it."""
        text = digest or ""
        length_text = text[:text.find("/")] if "/" in text else text.partition(":")[0]
        if not length_text.isdigit():
            return None
        length = int(length_text)
        blob = self._bytes()
        if not 1 <= length < len(blob) or blob[length] not in b",]":
            return None
        return length

    def extends(self, digest: str | None) -> bool:
        """Whether this conversation starts with every message of the one `digest` was taken
        of, unchanged. An empty or unknown digest matches nothing."""
        known = self._known.get(digest)
        return self.extends_each([digest])[0] if known is None else known
