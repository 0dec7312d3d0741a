"""Which earlier disclosure texts a turn re-applies (history: keep), in work that does not
grow with the turns an episode has had.

A turn re-applies an earlier turn's text while its conversation still starts with everything
that turn sent (core.disclosure.replayable, one digest comparison per earlier text). When it
extends the previous turn's conversation, the answer follows from the previous turn's own:
every text the previous turn re-applied, and the previous turn's text. So the last answer of
each recent episode is kept, and a turn that extends the conversation it was given for
checks one digest instead of all of them; the store, told what that answer covered
(`known`), then sends only the newest placement instead of all of them. Any other turn (the
first one this process sees of an episode, one after a rewritten history, one after parallel
calls) takes the full comparison, over all the placements. That also keeps a text the
previous turn left out (its conversation no longer started with that text's) out for good:
putting it back would break the append-only prompt.
"""

from __future__ import annotations

from budgetproxy.core.episode import Known, Placements
from budgetproxy.core.fingerprint import Fingerprint

# (the digest of the conversation it was given for, how many earlier texts there were then,
#  the (index, turn) it chose)
_Answer = tuple[str, int, tuple[tuple[int, int], ...]]

# At most this many (index, turn) pairs are kept across episodes (~120 bytes each: the pair and
# its two integers): ~16 MiB, 320 episodes of 400 turns. An episode pushed out takes the full
# comparison on its next turn, and is kept again from then on.
MAX_PAIRS = 1 << 17


class Replays:
    """The last answer for up to `size` episodes and `max_pairs` chosen texts in all, the
    least recently used dropped first; an ended episode's dropped at once (`drop`)."""

    def __init__(self, size: int = 4096, max_pairs: int = MAX_PAIRS) -> None:
        self.size = size
        self.max_pairs = max_pairs
        self._last: dict[str, _Answer] = {}  # in order of use (re-inserted on each)
        self._pairs = 0  # the (index, turn) pairs the answers kept hold

    def known(self, episode_id: str, conversation: Fingerprint) -> Known | None:
        """What this turn's store call may be told (`placements_known`): the episode's last
        answer, when this conversation extends the one it was given for; it holds when the
        placements are then that answer's and one more, made for that conversation."""
        last = self._last.get(episode_id)
        if last is None or not conversation.extends(last[0]):
            return None
        return Known(last[1] + 1, last[0], last[2])

    def replayable(self, episode_id: str, placements: Placements,
                   conversation: Fingerprint) -> list[tuple[int, int]]:
        """(index, turn) of the earlier placements to re-apply, as
        core.disclosure.replayable, remembered for the episode's next turn."""
        self.drop(episode_id)  # (re-inserted below: the most recent last)
        known, newest, every = placements.known, placements.newest, placements.every
        if known is not None and newest is not None:  # as `known` told: one more than it
            keep = (*known.answer, (newest[0], newest[1]))
        else:
            every = every or ()
            ok = conversation.extends_each([p[3] for p in every]) if every else []
            keep = tuple([(p[0], p[1]) for p, yes in zip(every, ok, strict=True) if yes])
        cache = self._last
        cache[episode_id] = (conversation.digest(), placements.size, keep)
        self._pairs += len(keep)
        while len(cache) > self.size or self._pairs > self.max_pairs:
            self._pairs -= len(cache.pop(next(iter(cache)))[2])
        return list(keep)

    def drop(self, episode_id: str) -> None:
        """Forget the episode's answer (it ended: no turn of it follows)."""
        last = self._last.pop(episode_id, None)
        if last is not None:
            self._pairs -= len(last[2])

    @property
    def pairs(self) -> int:
        """The (index, turn) pairs kept, in all."""
        return self._pairs
