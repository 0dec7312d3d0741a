"""A finished episode as the memory store retains it: one compact tuple of what reads and late
calls need (the episode view, a repeated outcome report, a call refused as finished).

An EpisodeState's instance dict with its ~45 fields takes about 2.4 KiB; the same values in
one tuple, without what only a live episode needs (the placements, digests, retry hash, the
report's metadata, the told texts) and with the tags as their JSON text, take a few hundred
bytes (tests/core/test_retained.py measures it under 1 KiB).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import orjson

from budgetproxy.core.episode import EpisodeState

# Fields a finished episode no longer needs: they take their defaults again when unpacked.
_DROPPED = frozenset({"disclosed_at", "last_hash", "messages_seen", "messages_digest",
                      "metadata", "told"})
KEPT: tuple[str, ...] = tuple([f.name for f in fields(EpisodeState) if f.name not in _DROPPED])
_TAGS = KEPT.index("tags")

Retained = tuple[Any, ...]


def pack(st: EpisodeState) -> Retained:
    """The finished episode's retained tuple (its values, the tags as JSON text or None)."""
    d = st.__dict__
    values = [d[name] for name in KEPT]
    tags = values[_TAGS]
    # as text: orjson's bytes keep the whole buffer it wrote into (4 KiB), a str its length
    values[_TAGS] = orjson.dumps(tags).decode() if tags else None
    return tuple(values)


def unpack(packed: Retained) -> EpisodeState:
    """A new EpisodeState from a retained tuple (the dropped fields at their defaults)."""
    values = dict(zip(KEPT, packed, strict=True))
    tags = values["tags"]
    values["tags"] = orjson.loads(tags) if tags is not None else {}
    return EpisodeState(**values)


# The bound tests/core/test_retained.py holds a retained episode to (ids of a few dozen
# characters, tags of a few short values; longer ones add their length), and what a
# remembered id of an evicted or expired episode takes (store/memory.py, ForgottenIds).
RETAINED_BYTES = 1024
TOMBSTONE_BYTES = 100


def retention_estimate(rate_per_s: float, retention_s: float, max_retained: int | None,
                       max_tombstones: int) -> tuple[int, int]:
    """(finished episodes retained, bytes at most) at `rate_per_s` episodes ending a second:
    what retention_s keeps, capped by max_retained, plus the tombstones of forgotten ids."""
    kept = int(rate_per_s * retention_s)
    if max_retained is not None:
        kept = min(kept, max_retained)
    return kept, kept * RETAINED_BYTES + max_tombstones * TOMBSTONE_BYTES
