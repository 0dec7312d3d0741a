"""Scoring calls against the fake LM's exact log-probabilities, and the answers' parsers."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from budgetproxy.likelihood.scoring import (
    LikelihoodInputError,
    Scorer,
    ScoringError,
    Unsupported,
    action_text,
    chatml,
    from_echo,
    from_prompt_logprobs,
)
from budgetproxy.testing.fake_lm import FakeLM, chat_ids, logprob, sequence_logprobs, text_tokens
from budgetproxy.testing.fake_tokens import BOS

MESSAGES: list[dict[str, Any]] = [{"role": "system", "content": "You play."},
                                  {"role": "user", "content": "Where next?"}]
CALL = {"id": "c1", "type": "function",
        "function": {"name": "move", "arguments": '{"direction": "left"}'}}
ACTION = {"role": "assistant", "content": "I go left", "tool_calls": [CALL]}


async def _score(lm: FakeLM, method: str, model: str = "m") -> tuple[float, int, Scorer]:
    async with httpx.AsyncClient(base_url=lm.base_url) as client:
        scorer = Scorer(client, method)
        got = await scorer.score(model, MESSAGES, ACTION)
    return got.logprob, got.tokens, scorer


async def test_prompt_logprobs_path_gives_the_exact_sum() -> None:
    full = chat_ids([*MESSAGES, ACTION], generation_prompt=False)
    start = len(chat_ids(MESSAGES))
    want = [lp for lp in sequence_logprobs("m", full)[start:] if lp is not None]
    with FakeLM() as lm:
        got, tokens, scorer = await _score(lm, "auto")
        sent = lm.requests
    assert got == pytest.approx(sum(want), abs=1e-12) and tokens == len(want)
    assert scorer.methods == {"m": "prompt_logprobs"} and scorer.calls == 2
    (full,) = [r for r in sent if "prompt_logprobs" in r]  # the two calls go at once
    assert full["add_generation_prompt"] is False and full["prompt_logprobs"] == 0
    assert full["messages"][-1]["tool_calls"] == [CALL]


async def test_echo_path_gives_the_exact_sum_of_the_replys_tokens() -> None:
    head = chatml(MESSAGES)
    text = head + action_text(ACTION) + "<|im_end|>"
    toks = text_tokens(text)
    lps = sequence_logprobs("m", [BOS, *(t for t, _, _ in toks)])[1:]
    want = [lp for (_, p, off), lp in zip(toks, lps, strict=True)
            if off + len(p) > len(head) and lp is not None]
    with FakeLM(offers=("echo",)) as lm:
        got, tokens, scorer = await _score(lm, "auto")
    assert got == pytest.approx(sum(want), abs=1e-12) and tokens == len(want)
    assert scorer.methods == {"m": "echo"}
    assert '"name": "move"' in action_text(ACTION)


async def test_an_upstream_offering_neither_is_named_in_one_error() -> None:
    with FakeLM(offers=()) as lm:
        with pytest.raises(LikelihoodInputError) as e:
            await _score(lm, "auto")
    assert "prompt_logprobs" in str(e.value) and "echo" in str(e.value)
    with FakeLM(offers=("echo",)) as lm, pytest.raises(Unsupported):
        await _score(lm, "prompt_logprobs")


def test_prompt_logprobs_picks_the_prompt_token_among_alternatives() -> None:
    entries = [None, {"7": {"logprob": -1.0}},
               {"8": {"logprob": -0.5}, "9": {"logprob": -2.0, "rank": 1}}]
    assert from_prompt_logprobs(entries, 1, [1, 7, 8]) == [-1.0, -0.5]
    with pytest.raises(ScoringError, match="several tokens"):
        from_prompt_logprobs(entries, 2)
    with pytest.raises(ScoringError, match="did not render"):
        from_prompt_logprobs(entries, 3)
    with pytest.raises(Unsupported):
        from_prompt_logprobs(None, 1)


def test_echo_counts_a_token_straddling_the_boundary_as_the_replys() -> None:
    lp = {"tokens": ["ab", "c\nd", "ef", "!"], "text_offset": [0, 2, 5, 7],
          "token_logprobs": [None, -1.0, -2.0, -4.0]}
    assert from_echo(lp, 4, 7) == [-1.0, -2.0]  # "c\nd" spans 2-5 and holds char 4
    with pytest.raises(Unsupported):
        from_echo({"token_logprobs": [None]}, 0, 1)


def test_the_fake_models_logprob_is_a_fixed_function() -> None:
    assert logprob("m", 1, 2) == logprob("m", 1, 2)
    assert -3.0 <= logprob("m", 1, 2) <= -0.001
    assert logprob("m", 1, 2) != logprob("n", 1, 2) or logprob("m", 2, 1) != logprob("n", 2, 1)


def test_a_malformed_tool_call_renders_without_failing() -> None:
    action = {"role": "assistant", "content": None, "tool_calls": ["oops", {"function": {
        "name": "f", "arguments": "not json"}}]}
    assert '"arguments": "not json"' in action_text(action)
    assert chatml([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
