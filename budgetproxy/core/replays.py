"""Which earlier disclosure texts a turn re-applies (history: keep), in work that does not
grow with the turns an episode has had.

A turn re-applies an earlier turn's text while its conversation still starts with everything
that turn sent (core.disclosure.replayable, one digest comparison per earlier text). When it
extends the previous turn's conversation, the answer follows from the previous turn's own:
every text the previous turn re-applied, and the previous turn's text. So the last answer of
each recent episode is kept, and a turn that extends the conversation it was given for checks
one digest instead of all of them. Any other turn (the first one this process sees of an
episode, one after a rewritten history, one after parallel calls) takes the full comparison.
That also keeps a text the previous turn left out (its conversation no longer started with
that text's) out for good: putting it back would break the append-only prompt.
"""

from __future__ import annotations

from budgetproxy.core.episode import Placed
from budgetproxy.core.fingerprint import Fingerprint

# (the digest of the conversation it was given for, how many earlier texts there were then,
#  the (index, turn) it chose)
_Answer = tuple[str, int, tuple[tuple[int, int], ...]]


class Replays:
    """The last answer for up to `size` episodes, the least recently used dropped first."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._last: dict[str, _Answer] = {}  # in order of use (re-inserted on each)

    def replayable(self, episode_id: str, placed: tuple[Placed, ...],
                   conversation: Fingerprint) -> list[tuple[int, int]]:
        """(index, turn) of the earlier placements to re-apply, as
        core.disclosure.replayable, remembered for the episode's next turn."""
        cache = self._last
        last = cache.pop(episode_id, None)
        n = len(placed)
        if (last is not None and n == last[1] + 1 and placed[-1][3] == last[0]
                and conversation.extends(last[0])):
            prev = placed[-1]
            keep = (*last[2], (prev[0], prev[1]))
        else:
            ok = conversation.extends_each([p[3] for p in placed]) if placed else []
            keep = tuple([(p[0], p[1]) for p, yes in zip(placed, ok, strict=True) if yes])
        cache[episode_id] = (conversation.digest(), n, keep)
        if len(cache) > self.size:
            del cache[next(iter(cache))]
        return list(keep)
