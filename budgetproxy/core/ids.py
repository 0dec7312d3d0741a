"""Episode identity: which ids are valid, and where on the wire they come from."""

from __future__ import annotations

import re

_VALID_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
# Path segments that name no segment: a URL resolves them away (RFC 3986), so an episode
# named so could not be reached by its `/episodes/{id}/v1` base URL, whose calls would go
# out as calls of no episode.
_DOT_SEGMENTS = frozenset((".", ".."))


def is_valid_episode_id(value: str) -> bool:
    return _VALID_ID.fullmatch(value) is not None and value not in _DOT_SEGMENTS


def split_episode_prefix(path: str) -> tuple[str, str] | None:
    """`/episodes/{id}/v1/...` → (id, "/v1/..."); None when the path has no such prefix."""
    if not path.startswith("/episodes/"):
        return None
    rest = path[len("/episodes/") :]
    slash = rest.find("/")
    if slash <= 0:
        return None
    tail = rest[slash:]
    if tail != "/v1" and not tail.startswith("/v1/"):
        return None
    return rest[:slash], tail
