"""Probe states: conversations rebuilt from turn records, and matched sampling."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from budgetproxy.probe.inject import corrected, inject_tool_error
from budgetproxy.probe.states import (
    Episode,
    ProbeInputError,
    State,
    episode_states,
    matched_sample,
    parse_selector,
    read_episodes,
    select,
)


def _turn(turn: int, offset: int, new: list[dict], text: str | None = None,
          status: str = "ok", attempt: int = 1) -> dict:
    return {"type": "turn", "episode_id": "e1", "turn": turn, "attempt": attempt,
            "status": status, "messages_offset": offset, "request_messages": new,
            "response": {"content": f"r{turn}", "tool_calls": None}, "model": "m-a",
            "disclosure": {"arm": "disclosed" if text else "hidden", "text": text}}


def _episode(turns: list[dict], **extra: object) -> Episode:
    rec = {"type": "episode", "episode_id": "e1", "task_id": "t1", "budget": 5,
           "max_turns": 10, "turns_used": 1, "disclosure": "disclosed",
           "model": "m-a", "tags": {"policy": "p"}, **extra}
    return Episode(rec, turns)


def test_conversations_are_rebuilt_with_the_disclosure_the_model_saw() -> None:
    u1, a1 = {"role": "user", "content": "hi"}, {"role": "assistant", "content": "r1"}
    u2 = {"role": "user", "content": "next"}
    ep = _episode([
        _turn(1, 0, [u1], "Turn 1 of 5."),
        _turn(2, 1, [a1, u2], "Turn 2 of 5.", status="upstream_error"),
        _turn(2, 1, [a1, u2], "Turn 2 of 5.", attempt=2),
    ], turns_used=2)
    states = episode_states(ep, "a")
    assert [s.turn for s in states] == [1, 2]
    first, second = states
    assert first.conversation == (u1,)
    assert first.messages[-1]["content"] == "hi\n\nTurn 1 of 5."
    assert second.conversation == (u1, a1, u2)
    # history: keep — turn 1's text stays where it was placed
    assert [m["content"] for m in second.messages] == [
        "hi\n\nTurn 1 of 5.", "r1", "next\n\nTurn 2 of 5."]
    assert (second.fraction, second.remaining, second.action) == (1.0, 4, {
        "content": "r2", "tool_calls": None})


def test_logs_without_texts_are_refused_in_one_line() -> None:
    ep = _episode([_turn(1, 0, [{"role": "user", "content": {"length": 3}}])])
    with pytest.raises(ProbeInputError, match="content: full"):
        episode_states(ep, "a")


def test_selectors_read_fields_and_tags() -> None:
    assert parse_selector("model=x=y") == ("model", "x=y")
    with pytest.raises(ProbeInputError):
        parse_selector("model")
    ep = _episode([_turn(1, 0, [{"role": "user", "content": "hi"}])])
    b = Episode({**ep.record, "episode_id": "e2", "tags": {"policy": "q"}}, ep.turns)
    sel = select({"e1": ep, "e2": b}, ("policy", "p"), ("tags.policy", "q"))
    assert sel.episodes == {"a": 1, "b": 1} and sel.models == {"a": "m-a", "b": "m-a"}
    with pytest.raises(ProbeInputError, match="no finished episode"):
        select({"e1": ep}, ("policy", "p"), ("policy", "nobody"))


def _pool(sizes: dict[str, int], side: str) -> dict[str, list[State]]:
    return {task: [State(task_id=task, source=side, episode_id=f"{side}{task}{i}", turn=1,
                         fraction=0.5, conversation=(), messages=(), disclosure="hidden",
                         budget=None, max_turns=None, remaining=None) for i in range(n)]
            for task, n in sizes.items() if n}


@given(st.dictionaries(st.sampled_from("tuvwxyz"), st.tuples(st.integers(0, 9),
                                                               st.integers(0, 9))),
       st.integers(0, 60), st.integers(0, 10**6))
def test_matched_sampling_is_balanced_by_construction(
    sizes: dict[str, tuple[int, int]], n: int, seed: int,
) -> None:
    pools = {"a": _pool({t: s[0] for t, s in sizes.items()}, "a"),
             "b": _pool({t: s[1] for t, s in sizes.items()}, "b")}
    got = matched_sample(pools, n, random.Random(seed))
    room = sum(min(a, b) for a, b in sizes.values())
    assert len(got) == 2 * min(n // 2, room)
    for task in sizes:
        mine = [s for s in got if s.task_id == task]
        assert sum(s.source == "a" for s in mine) == sum(s.source == "b" for s in mine)
        assert all(s.episode_id.startswith(s.source) for s in mine)  # from its own pool
    assert len({s.episode_id for s in got}) == len(got)  # no state twice
    # tasks share the quota evenly: no task gets two pairs more than one that had room
    pairs = {t: sum(s.source == "a" for s in got if s.task_id == t) for t in sizes}
    for k in pairs.values():
        for u, j in pairs.items():
            if k > j + 1:
                assert j == min(sizes[u])


def test_tool_error_injection_replaces_the_last_tool_result() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "run", "arguments": '{"x":1}'}}
    conv = ({"role": "user", "content": "go"}, {"role": "assistant", "content": None,
                                                "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok: 3"},
            {"role": "user", "content": "and?"})
    seen = (*conv[:3], {"role": "user", "content": "and?\n\nTurn 2 of 4."})
    state = State(task_id="t", source="a", episode_id="e", turn=2, fraction=0.5,
                  conversation=conv, messages=seen, disclosure="disclosed", budget=4,
                  max_turns=4, remaining=3)
    hurt = inject_tool_error(state, random.Random(0))
    assert hurt is not None and hurt.failed_call == 'run({"x":1})'
    assert hurt.conversation[2]["content"].startswith("Error: the tool call failed (run)")
    assert hurt.messages[2]["content"] == hurt.conversation[2]["content"]
    assert hurt.messages[3]["content"] == "and?\n\nTurn 2 of 4."  # disclosure kept
    observed = inject_tool_error(state, random.Random(0), errors=["Error: timeout"])
    assert observed is not None and observed.conversation[2]["content"] == "Error: timeout"
    assert corrected(hurt, {"tool_calls": [{**call, "function": {
        "name": "run", "arguments": '{ "x": 1 }'}}]}) is False  # the same call again
    assert corrected(hurt, {"content": "giving up", "tool_calls": None}) is True
    assert corrected(state, {"content": "x"}) is None
    no_tool = State(**{**state.__dict__, "conversation": conv[:1], "messages": conv[:1]})
    assert inject_tool_error(no_tool, random.Random(0)) is None


def test_rotated_gzip_logs_are_read_with_plain_ones(tmp_path: Path) -> None:
    ep = _episode([_turn(1, 0, [{"role": "user", "content": "hi"}])])
    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as fh:
        fh.write(json.dumps(ep.turns[0]) + "\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.jsonl").write_text(json.dumps(ep.record) + "\n{broken\n")
    got = read_episodes([tmp_path])
    assert list(got) == ["e1"] and [t["turn"] for t in got["e1"].turns] == [1]
    with pytest.raises(ProbeInputError, match="no such file"):
        read_episodes([tmp_path / "missing"])


def test_the_sample_does_not_depend_on_log_order_or_episode_ids() -> None:
    """Two runs of a concurrent harness log the same episodes in another order under other
    ids: the same states are drawn (by what the model saw), with the same sampling digests."""
    def pools(ids: list[str]) -> dict[str, dict[str, list[State]]]:
        out: dict[str, dict[str, list[State]]] = {"a": {}, "b": {}}
        for side in ("a", "b"):
            for i, eid in enumerate(ids):
                msgs = ({"role": "user", "content": f"{side} state {i}"},)
                out[side].setdefault("t", []).append(State(
                    task_id="t", source=side, episode_id=f"{side}-{eid}", turn=1,
                    fraction=i / 10, conversation=msgs, messages=msgs, disclosure="hidden",
                    budget=None, max_turns=None, remaining=None))
        return out

    first = pools([f"id{i}" for i in range(10)])
    second = {side: {"t": list(reversed(pools([f"other{i}" for i in range(10)])[side]["t"]))}
              for side in ("a", "b")}
    one = matched_sample(first, 6, random.Random(7))
    two = matched_sample(second, 6, random.Random(7))
    assert [s.digest for s in one] == [s.digest for s in two]
    assert [s.fraction for s in one] == [s.fraction for s in two]
    assert {s.episode_id for s in one}.isdisjoint({s.episode_id for s in two})
