"""Token trajectories: when an episode's captured turns form one append-only sequence, and the
sequence, loss mask and logprobs a trainer reads from it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def last_attempts(turns: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per turn, in turn order: its highest answered attempt, the one the agent went
    on from (a client resends a turn only after giving up on the attempt before, whose answer
    may still be logged after the resend's); of entries with the same attempt, the last."""
    by_turn: dict[int, dict[str, Any]] = {}
    for t in turns:
        turn = int(t.get("turn") or 0)
        kept = by_turn.get(turn)
        if kept is None or int(t.get("attempt") or 0) >= int(kept.get("attempt") or 0):
            by_turn[turn] = t
    return [by_turn[k] for k in sorted(by_turn)]


def extends(prev_prompt: Sequence[int] | None, prev_completion: Sequence[int] | None,
            prompt: Sequence[int] | None) -> bool:
    """Whether `prompt` starts with the previous turn's prompt followed by its completion:
    the tokens the model saw and sampled then are, unchanged, the start of what it sees now.

    That holds when the conversation only grew (disclosure `history: keep` re-applies earlier
    budget texts where they were) and the server's chat template renders the model's own
    message back to the tokens it sampled. It fails when a budget text was dropped
    (`history: drop`), the client rewrote its history, or the template changes earlier turns
    (one that strips reasoning from past assistant messages, say)."""
    if prev_prompt is None or prev_completion is None or prompt is None:
        return False
    n, m = len(prev_prompt), len(prev_completion)
    if len(prompt) < n + m:
        return False
    return list(prompt[:n]) == list(prev_prompt) and list(prompt[n:n + m]) == list(
        prev_completion)


@dataclass(frozen=True)
class TokenSequence:
    """An episode's turns as one sequence: what the last turn saw plus what it sampled."""

    token_ids: list[int]
    loss_mask: list[int]  # 1 on tokens the model sampled, 0 on prompt tokens
    logprobs: list[float | None]  # the sampled tokens' logprobs; None on prompt tokens


def sequence(turns: Sequence[dict[str, Any]]) -> TokenSequence | None:
    """One sequence for turns (in order, each with prompt_token_ids, completion_token_ids
    and logprobs) when every turn extends the one before; None otherwise or when a turn has
    no token ids."""
    if not turns:
        return None
    ids: list[int] = []
    mask: list[int] = []
    lps: list[float | None] = []
    prev: dict[str, Any] | None = None
    for t in turns:
        prompt, completion = t.get("prompt_token_ids"), t.get("completion_token_ids")
        if prompt is None or completion is None:
            return None
        if prev is not None and not extends(prev["prompt_token_ids"],
                                            prev["completion_token_ids"], prompt):
            return None
        new_prompt = prompt[len(ids):]
        ids.extend(new_prompt)
        mask.extend([0] * len(new_prompt))
        lps.extend([None] * len(new_prompt))
        logprobs = t.get("logprobs")
        ids.extend(completion)
        mask.extend([1] * len(completion))
        if isinstance(logprobs, list) and len(logprobs) == len(completion):
            lps.extend(logprobs)
        else:
            lps.extend([None] * len(completion))
        prev = t
    return TokenSequence(ids, mask, lps)
