"""Rollout ids on the wire: agent-lightning-style path prefixes and per-episode bearer keys."""

from __future__ import annotations

import hashlib
import hmac

from budgetproxy.core.ids import is_valid_episode_id

ROLLOUT_PREFIX = "/rollout/"
KEY_PREFIX = "bpk."  # an episode key: bpk.<episode id>.<signature>
_SIGNATURE_CHARS = 32


def split_rollout_prefix(path: str) -> tuple[str, str, str] | None:
    """`/rollout/{rid}/attempt/{aid}/v1/...` → (rid, aid, "/v1/..."); None for other paths.

    One attempt is one episode (id `{rid}:{aid}`), the rollout its group."""
    if not path.startswith(ROLLOUT_PREFIX):
        return None
    parts = path[len(ROLLOUT_PREFIX):].split("/", 3)
    if len(parts) < 3 or parts[1] != "attempt" or not parts[0] or not parts[2]:
        return None
    tail = "/" + parts[3] if len(parts) == 4 else ""
    if tail != "/v1" and not tail.startswith("/v1/"):
        return None
    return parts[0], parts[2], tail


def attempt_episode_id(rollout_id: str, attempt_id: str) -> str | None:
    """An attempt's episode, `{rid}:{aid}`; None for an attempt id holding a ':', which
    would make two attempts one episode (`r:1` + `a` and `r` + `1:a`): an episode id splits
    into its rollout and attempt at its last ':'."""
    if ":" in attempt_id:
        return None
    return f"{rollout_id}:{attempt_id}"


def _signature(secret: bytes, episode_id: str) -> str:
    digest = hmac.new(secret, episode_id.encode(), hashlib.sha256).hexdigest()
    return digest[:_SIGNATURE_CHARS]


def mint_key(secret: bytes, episode_id: str) -> str:
    """A bearer key that names `episode_id` and proves it was minted with `secret`."""
    return f"{KEY_PREFIX}{episode_id}.{_signature(secret, episode_id)}"


def key_episode(secret: bytes, key: str) -> str | None:
    """The episode a minted key names; None when it is not one or its signature is wrong
    (compared in constant time)."""
    if not key.startswith(KEY_PREFIX):
        return None
    eid, dot, sig = key[len(KEY_PREFIX):].rpartition(".")
    parts = eid.split("/")  # a tenant's episode: tenant/id, as the store knows it
    if not dot or len(parts) > 2 or not all(is_valid_episode_id(p) for p in parts):
        return None
    if not hmac.compare_digest(sig, _signature(secret, eid)):
        return None
    return eid
