"""Rollout path prefixes and per-episode keys (pure)."""

from __future__ import annotations

from budgetproxy.core.rollout_ids import (
    attempt_episode_id,
    key_episode,
    mint_key,
    split_rollout_prefix,
)


def test_split_rollout_prefix() -> None:
    assert split_rollout_prefix("/rollout/ro-1/attempt/at-2/v1/chat/completions") == (
        "ro-1", "at-2", "/v1/chat/completions")
    assert split_rollout_prefix("/rollout/ro-1/attempt/at-2/v1") == ("ro-1", "at-2", "/v1")
    for bad in ("/rollout/ro-1/v1/chat/completions", "/rollout//attempt/a/v1",
                "/rollout/r/attempt//v1", "/rollout/r/attempt/a/v2/x", "/rollout/r/attempt/a",
                "/episodes/e/v1", "/rollout/r/try/a/v1"):
        assert split_rollout_prefix(bad) is None, bad
    assert attempt_episode_id("ro-1", "at-2") == "ro-1:at-2"
    # one episode id, one attempt: r:1 + a is r:1:a, and r + 1:a is refused
    assert attempt_episode_id("r:1", "a") == "r:1:a"
    assert attempt_episode_id("r", "1:a") is None


def test_keys_name_their_episode_and_are_signed() -> None:
    secret = b"s" * 32
    key = mint_key(secret, "ro-1:at-2")
    assert key.startswith("bpk.ro-1:at-2.")
    assert key_episode(secret, key) == "ro-1:at-2"
    assert key_episode(b"other" * 8, key) is None
    assert key_episode(secret, key[:-1] + ("0" if key[-1] != "0" else "1")) is None
    assert key_episode(secret, "bpk.ro-1:at-2") is None
    assert key_episode(secret, "sk-plain") is None
    assert key_episode(secret, "bpk.bad id!." + "0" * 32) is None
