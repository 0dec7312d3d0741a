"""The earlier texts a turn re-applies, chosen from the previous turn's answer: the same as the
full comparison while the conversation grows, one digest checked instead of all of them, and
only the newest placement needed from the store."""

from __future__ import annotations

from typing import Any
from unittest import mock

from budgetproxy.core import disclosure
from budgetproxy.core.episode import Known, place, placed, placements_of
from budgetproxy.core.fingerprint import Fingerprint
from budgetproxy.core.replays import Replays


def grow(turns: int) -> list[list[dict[str, Any]]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    out = []
    for t in range(1, turns + 1):
        msgs = [*msgs, {"role": "user", "content": f"u{t}"}]
        out.append(msgs)
        msgs = [*msgs, {"role": "assistant", "content": f"a{t}"}]
    return out


def one_turn(replays: Replays, eid: str, entries: list[list[Any]], turn: int,
             msgs: list[Any]) -> tuple[list[tuple[int, int]], Known | None]:
    """A turn as the proxy takes it: ask what it holds, get the store's placements (as the
    memory store gives them), choose, place this turn's; checked against the full comparison."""
    f = Fingerprint(msgs)
    known = replays.known(eid, f)
    got = replays.replayable(eid, placements_of(entries, known), f)
    assert got == disclosure.replayable(placed(entries), Fingerprint(msgs)), turn
    place(entries, [len(msgs) - 1, turn, len(msgs), f.digest()])
    return got, known


def play(replays: Replays, convos: list[list[Any]], eid: str = "e"
         ) -> list[list[tuple[int, int]]]:
    entries: list[list[Any]] = []
    return [one_turn(replays, eid, entries, turn, msgs)[0]
            for turn, msgs in enumerate(convos, 1)]


def test_a_growing_conversation_checks_one_digest_a_turn() -> None:
    replays = Replays()
    checked: list[int] = []
    real = Fingerprint.extends_each
    entries: list[list[Any]] = []
    warm = []

    def counted(self: Fingerprint, digests: list[str | None]) -> list[bool]:
        checked.append(len(digests))
        return real(self, digests)

    for turn, msgs in enumerate(grow(30), 1):
        f = Fingerprint(msgs)
        with mock.patch.object(Fingerprint, "extends_each", counted):
            known = replays.known("e", f)
            got = replays.replayable("e", placements_of(entries, known), f)
        assert got == disclosure.replayable(placed(entries), Fingerprint(msgs)), turn
        place(entries, [len(msgs) - 1, turn, len(msgs), f.digest()])
        warm.append(known is not None)
    assert got == [(2 * t - 1, t) for t in range(1, 30)]
    # the first turn has nothing to check, the second compares its one, then one a turn
    assert checked == [1] * 29, checked
    # and from the second on, the store is told the placements it need not send
    assert warm == [False] + [True] * 29


def test_texts_left_out_after_a_rewrite_stay_out() -> None:
    convos = grow(4)
    summary = [{"role": "system", "content": "sys"}, {"role": "user", "content": "summary"}]
    after = [*summary, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "u6"}]
    answers = play(Replays(), [*convos, summary, after])
    assert answers[4] == [] and answers[5] == [(1, 5)]


def test_parallel_calls_and_other_episodes_take_the_full_comparison() -> None:
    replays = Replays(size=1)
    convos = grow(3)
    play(replays, convos[:2], "a")
    play(replays, convos[:2], "b")  # evicts a's answer
    f = Fingerprint(convos[2])
    assert replays.known("a", f) is None
    entries = [[1, 1, 2, Fingerprint(convos[0]).digest()],
               [3, 2, 4, Fingerprint(convos[1]).digest()]]
    assert replays.replayable("a", placements_of(entries, None), f) == [(1, 1), (3, 2)]


def test_a_call_keeps_what_it_asked_with_while_another_answers() -> None:
    """Two calls of one episode in flight: each chooses from what it told the store, whatever
    the other left in the cache meanwhile; one the store found otherwise compares them all."""
    replays = Replays()
    convos = grow(4)
    entries: list[list[Any]] = []
    for turn, msgs in enumerate(convos[:2], 1):
        one_turn(replays, "e", entries, turn, msgs)
    f3, f4 = Fingerprint(convos[2]), Fingerprint(convos[3])
    k3, k4 = replays.known("e", f3), replays.known("e", f4)
    assert k3 is not None and k4 is not None
    p3 = placements_of(entries, k3)
    place(entries, [len(convos[2]) - 1, 3, len(convos[2]), f3.digest()])
    p4 = placements_of(entries, k4)  # the other call placed one meanwhile: not as told
    assert p3.every is None and p4.every is not None and p4.known is None
    assert replays.replayable("e", p4, f4) == disclosure.replayable(p4.every, f4)
    assert replays.replayable("e", p3, f3) == [(1, 1), (3, 2)]


def test_answers_kept_are_bounded_by_their_pairs_and_an_ended_episode_is_dropped() -> None:
    """The texts chosen are kept for at most `max_pairs` (index, turn) pairs in all, the
    episode used least recently dropped first (its next turn compares them all, and gets the
    same answer); `drop` forgets an ended episode's answer and what it counted."""
    replays = Replays(max_pairs=10)
    convos = grow(8)
    play(replays, convos[:6], "a")  # its last answer: 5 pairs
    assert replays.pairs == 5
    play(replays, convos[:7], "b")  # 6 more: past 10, so a's answer goes
    assert replays.pairs == 6 and replays.known("a", Fingerprint(convos[6])) is None
    entries = [[2 * t - 1, t, 2 * t, Fingerprint(convos[t - 1]).digest()] for t in range(1, 7)]
    f = Fingerprint(convos[6])
    assert replays.replayable("a", placements_of(entries, None), f) == [
        (2 * t - 1, t) for t in range(1, 7)]
    assert replays.pairs == 6 and replays.known("b", Fingerprint(convos[7])) is None
    replays.drop("a")
    replays.drop("a")  # (twice: counted once)
    assert replays.pairs == 0 and replays.known("a", Fingerprint(convos[7])) is None
