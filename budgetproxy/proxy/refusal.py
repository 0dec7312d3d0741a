"""The status a refused model call carries, per client: the one that makes the client stop."""

from __future__ import annotations

# Agent CLIs that misread the contract's 403, by User-Agent prefix (lower case). Codex CLI
# (`codex_exec/...`, `codex_cli_rs/...`: every originator starts with "codex") reconnects five
# times on any status but 400 and 429, and prints "exceeded retry limit" on a 429; Claude Code
# (`claude-cli/...`) prints "Failed to authenticate" on a 401 or 403. Both stop at once on a
# 400 and print the error's message (tried with codex-cli 0.171.0 and Claude Code 2.1.197).
STOP_ON_400 = (b"codex", b"claude-cli/")


def refusal_status(headers: dict[bytes, bytes]) -> int:
    """403 for a spent budget or a finished episode, or 400 for a client that stops at once
    only on that (the error's code and message are the same either way)."""
    agent = headers.get(b"user-agent", b"")[:16].lower()
    return 400 if agent.startswith(STOP_ON_400) else 403
