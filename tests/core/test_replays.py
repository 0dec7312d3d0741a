"""The earlier texts a turn re-applies, chosen from the previous turn's answer: the same as the
full comparison while the conversation grows, one digest checked instead of all of them."""

from __future__ import annotations

from typing import Any
from unittest import mock

from budgetproxy.core import disclosure
from budgetproxy.core.episode import Placed
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


def play(replays: Replays, convos: list[list[Any]], eid: str = "e"
         ) -> list[list[tuple[int, int]]]:
    placed: list[Placed] = []
    answers = []
    for turn, msgs in enumerate(convos, 1):
        f = Fingerprint(msgs)
        got = replays.replayable(eid, tuple(placed), f)
        assert got == disclosure.replayable(placed, Fingerprint(msgs)), turn
        answers.append(got)
        placed.append((len(msgs) - 1, turn, len(msgs), f.digest()))
    return answers


def test_a_growing_conversation_checks_one_digest_a_turn() -> None:
    replays = Replays()
    checked: list[int] = []
    real = Fingerprint.extends_each
    placed: list[Placed] = []
    for turn, msgs in enumerate(grow(30), 1):
        f = Fingerprint(msgs)

        def counted(self: Fingerprint, digests: list[str | None]) -> list[bool]:
            checked.append(len(digests))
            return real(self, digests)

        with mock.patch.object(Fingerprint, "extends_each", counted):
            got = replays.replayable("e", tuple(placed), f)
        assert got == disclosure.replayable(placed, Fingerprint(msgs)), turn
        placed.append((len(msgs) - 1, turn, len(msgs), f.digest()))
    assert got == [(2 * t - 1, t) for t in range(1, 30)]
    # the first turn has nothing to check, the second compares its one, then one a turn
    assert checked == [1] * 29, checked


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
    placed: tuple[Placed, ...] = (
        (1, 1, 2, Fingerprint(convos[0]).digest()), (3, 2, 4, Fingerprint(convos[1]).digest()))
    assert replays.replayable("a", placed, f) == [(1, 1), (3, 2)]
