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
from budgetproxy.proxy.grouping import KeptTurn, exact
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
