"""Kept turns (proxy/grouping.py) in the memory turn log: the bytes it counts are the bytes it
holds, so `rollouts.max_bytes` bounds the memory the kept turns take."""

from __future__ import annotations

import gc
import sys
import tracemalloc

import orjson

from budgetproxy.core.episode import EpisodeState
from budgetproxy.proxy.calls import ModelCall
from budgetproxy.proxy.dialects import DIALECTS
from budgetproxy.proxy.grouping import OVERHEAD, KeptTurn, _head_tail, exact
from budgetproxy.store.turn_log import MemoryTurnLog

MESSAGES = DIALECTS["/v1/messages"]


def _call(turn: int, stream: bool) -> tuple[ModelCall, dict[str, object]]:
    """A Messages call of a conversation `turn` exchanges long, sent as forward.py sends it
    (orjson's output: a block up to twice its length)."""
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} " + "x" * 2000}
                for i in range(2 * turn + 1)]
    payload = {"model": "m", "max_tokens": 100, "messages": messages}
    call = ModelCall("/v1/messages", MESSAGES)
    call.upstream_body = orjson.dumps(payload)
    call.sent = MESSAGES.conversation(payload)
    call.disclosure_text = f"Turn {turn} of 200."
    reply = {"message": {"role": "assistant", "content": "ok " * 100}, "finish_reason": "stop",
             "usage": {"input_tokens": 10, "output_tokens": 5}}
    if stream:
        call.events = []
    else:
        call.data = orjson.dumps({"id": "msg", "type": "message", "role": "assistant",
                                  "content": [{"type": "text", "text": "ok " * 100}],
                                  "stop_reason": "end_turn",
                                  "usage": {"input_tokens": 10, "output_tokens": 5}})
    return call, reply


def test_orjson_output_is_larger_than_its_length_and_exact_is_not() -> None:
    body = orjson.dumps({"messages": ["x" * 400] * 300})
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        copy = exact(body)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert copy == body and copy is not body
    assert len(body) <= held <= len(body) + 64


async def test_the_log_holds_what_it_counts_within_max_bytes() -> None:
    """Growing conversations of 40-250 KB bodies, 8 episodes at a time, far past max_bytes:
    the memory the log holds (traced) is its counted total, which stays within max_bytes."""
    max_bytes = 8 * 1024 * 1024
    log = MemoryTurnLog(600, max_bytes=max_bytes, max_episode_bytes=2 * 1024 * 1024)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for episode in range(24):
            st = EpisodeState(episode_id=f"ep-{episode}", budget=200, max_turns=None,
                              disclosure="disclosed")
            for turn in range(10, 60, 2):  # bodies of ~42 to ~242 KB
                call, reply = _call(turn, stream=turn % 4 == 0)
                call.episode_id = st.episode_id
                kept = KeptTurn.of(call, st, reply, full=True, lazy=True)
                await log.append(st.episode_id, kept)
                st.turns_used += 1
                del call, kept
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    counted = log._total
    assert 0.9 * max_bytes <= counted <= max_bytes
    # the log's lists and dicts, and the episodes' ids, beside the entries it counts
    assert counted <= held <= counted * 1.02 + 64 * 1024, (held, counted)
    assert held <= 1.03 * max_bytes


def test_a_small_entry_counts_its_objects() -> None:
    """Entries of a first turn (about 2.5 KB of bodies): what each holds, traced, is no more
    than its size, and within 10% of it."""
    st = EpisodeState(episode_id="ep", budget=10, max_turns=None, disclosure="disclosed")
    for stream in (True, False):
        calls = [_call(0, stream) for _ in range(100)]
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            kept = [KeptTurn.of(call, st, reply, full=True, lazy=True) for call, reply in calls]
            held = tracemalloc.get_traced_memory()[0] - base - sys.getsizeof(kept)
        finally:
            tracemalloc.stop()
        size = sum(k.size for k in kept)
        assert 0.9 * size <= held <= size, (type(kept[0]).__name__, held, size)


def _following_cases() -> list[tuple[dict[str, object] | None, str | None, dict[str, object] | None,
                                     list[object]]]:
    reply = {"message": {"role": "assistant", "content": "done"}, "finish_reason": "stop",
             "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
    tokens = {"prompt_token_ids": [1, 2], "completion_token_ids": [3], "logprobs": [-0.5]}
    new = [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b \u00e9"}]
    return [(reply, "2 turns remain", None, new), (None, None, None, []),
            (reply, None, tokens, new), (reply, "1 turn remains", tokens, [{"x": [[{"y": 1}]]}])]


def test_an_entry_that_follows_an_earlier_one_is_written_as_its_parts_would_be() -> None:
    """`KeptTurn.following` writes the entry in one go: the bytes `written` makes from the
    head and tail, content full or not, and `small` reads the head and tail back from them."""
    for reply, text, tokens, new in _following_cases():
        for full in (True, False):
            after = (3, 1, 5, new)
            kept = KeptTurn.following(4, 2, reply, text, tokens, full, after)
            head, tail = _head_tail(4, 2, reply, text, tokens, full)
            parts = KeptTurn(head, tail, full=full, numbers=(4, 2))
            assert kept.encode() == parts.written(new, (3, 1, 5))
            assert kept.small() == parts.small()
            assert kept.after == (3, 1, 5) and kept.numbers == (4, 2)
            assert kept.size == len(kept.encode()) + OVERHEAD


def test_an_entry_that_follows_with_an_integer_past_64_bits_keeps_it_exact() -> None:
    """What orjson cannot write (an integer past 64 bits, read again exact) is written by the
    standard library, as `written` does, and read back whole."""
    new = [{"role": "user", "content": "seed", "seed": 2**70 + 1}]
    kept = KeptTurn.following(2, 1, None, "t", None, True, (1, 1, 1, new))
    assert b"1180591620717411303425" in kept.encode()
    assert kept.small().endswith(b'"truncated":true}')
    assert orjson.loads(kept.small())["messages"] is None
