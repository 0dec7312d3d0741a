"""Episode identity: which ids are valid, and where on the wire they come from."""

from __future__ import annotations

import re

_VALID_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


def is_valid_episode_id(value: str) -> bool:
    return _VALID_ID.fullmatch(value) is not None


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
