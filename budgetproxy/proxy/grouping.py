"""What rollouts keep as episodes run: group members joined and waiters woken
(store/groups.py), and each turn as the model saw it (store/turn_log.py)."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, MutableMapping
from typing import Any

import orjson

from budgetproxy.core.episode import EpisodeState
from budgetproxy.core.prefixes import starts_with
from budgetproxy.core.tenants import tenant_of
from budgetproxy.errors import invalid_request
from budgetproxy.proxy.calls import ModelCall, exact_conversation, turn_numbers
from budgetproxy.proxy.capture import Tokens
from budgetproxy.proxy.experiments import Experiments
from budgetproxy.proxy.wire import encode_exact, has_lossy_float, read_exact
from budgetproxy.store.base import StoreUnavailable
from budgetproxy.store.groups import GroupKey, GroupStore
from budgetproxy.store.turn_log import MemoryTurnLog, TurnLog
from budgetproxy.telemetry.metrics import Metrics
from budgetproxy.trajectories.recorder import Recorder, strip_text
from budgetproxy.trajectories.sink import TrajectorySink

log = logging.getLogger("budgetproxy")

GROUP_SIZE_MAX = 10_000
LAST_KEPT = 4096  # episodes whose last kept turn is remembered (RolloutRecorder)
WRITTEN_BYTES = 32 << 20  # messages of entries written whole, kept to compare the next with


def tenant_group(tenant: str | None, task_id: str, group: str) -> GroupKey:
    """A group's key in its tenant's namespace (the default one keeps the plain task id; a
    NUL, which no header can carry, parts a tenant from the task)."""
    return (task_id if tenant is None else f"{tenant}\0{task_id}"), group


def group_key(st: EpisodeState) -> GroupKey | None:
    """An episode's group: (task_id, group) in its tenant's namespace, when it names both."""
    if st.task_id is None or st.group is None:
        return None
    return tenant_group(tenant_of(st.episode_id), st.task_id, st.group)


def group_size(headers: dict[bytes, bytes]) -> int | None:
    """X-Episode-Group-Size, read on an episode's first call."""
    raw = headers.get(b"x-episode-group-size")
    if raw is None or raw == b"":
        return None
    digits = raw.strip()
    if not digits.isdigit() or not 1 <= int(digits) <= GROUP_SIZE_MAX:
        raise invalid_request(
            f"Header X-Episode-Group-Size must be an integer from 1 to {GROUP_SIZE_MAX}, "
            f"got {raw.decode('latin-1')!r}", "group_size")
    return int(digits)


class KeptTurn:
    """A turn as GET /v1/episodes/{id}/trajectory gives it (store/turn_log.py): `{turn,
    attempt, response, finish_reason, usage, messages, disclosure_text}` and, when tokens were
    captured, `prompt_token_ids, completion_token_ids, logprobs`; `messages` is the
    conversation as the upstream got it.

    Kept as bytes: the fields around the messages as JSON (`head`, `tail`), and either the
    whole entry's JSON (`data`) or the request body the upstream got (`body`), which `read`
    (its dialect's conversation) turns back into the messages when the entry is read. So the
    memory log writes no messages per turn, and what it keeps is the body already sent, copied
    (`exact`) so that its size is what it holds."""

    __slots__ = ("head", "tail", "data", "body", "read", "full", "count", "numbers", "after",
                 "again")

    def __init__(self, head: bytes, tail: bytes, *, data: bytes | None = None,
                 body: bytes | None = None,
                 read: Callable[[dict[str, Any]], list[Any]] | None = None,
                 full: bool = True, numbers: tuple[int, int] = (0, 0)) -> None:
        self.head = head  # {"turn":..,"attempt":..,"response":..,"finish_reason":..,"usage":..}
        self.tail = tail  # {"disclosure_text":..[,"prompt_token_ids":..,...]}
        self.data = data
        self.body = body
        self.read = read
        self.full = full  # content: full (else texts are left out of the messages)
        self.count: int | None = None  # the messages in `data`, when written whole here
        self.numbers = numbers  # its turn and attempt
        # (turn, attempt, n): its messages follow the first n of that entry's (store/turn_log.py)
        self.after: tuple[int, int, int] | None = None
        # its whole form, for a log that finds the entry it follows missing (Redis: a lost
        # write, another replica's turn); a memory log checks before, and keeps no such call
        self.again: Callable[[], KeptTurn | LazyTurn] | None = None

    def whole(self) -> KeptTurn | LazyTurn:
        return self if self.again is None else self.again()

    @property
    def size(self) -> int:
        held = self.data if self.data is not None else self.body
        return len(self.head) + len(self.tail) + (0 if held is None else len(held)) + OVERHEAD

    def encode(self) -> bytes:
        if self.data is not None:
            return self.data
        messages = None
        if self.body is not None and self.read is not None:
            payload = orjson.loads(self.body)
            if has_lossy_float(payload):  # (a body sent as the client wrote it)
                payload = read_exact(self.body) or payload
            messages = self.read(payload)
        return self.written(messages)

    def written(self, messages: list[Any] | None,
                after: tuple[int, int, int] | None = None) -> bytes:
        """The entry's JSON with these messages (texts left out unless `full`). With `after`
        (turn, attempt, n): they are what follows the first n messages of that turn's entry
        (store/turn_log.py `expand` puts them together when the entry is read)."""
        if messages is not None and not self.full:
            messages = strip_text(messages)
        try:
            text = orjson.dumps(messages)
        except TypeError:  # an integer past 64 bits (a payload read again exact, wire.py), or
            try:  # nesting past orjson's 254 levels: written by the standard library
                text = encode_exact(messages)
            except (RecursionError, ValueError):  # past its depth too: kept without messages
                return self.small()
        if after is not None:
            return b'%b,"messages_after":[%d,%d,%d],"messages":%b,%b' % (
                self.head[:-1], *after, text, self.tail[1:])
        return b'%b,"messages":%b,%b' % (self.head[:-1], text, self.tail[1:])

    def small(self) -> bytes:
        head, tail = self.head, self.tail
        if not head and self.data is not None:  # (written in one go: `following`)
            fields = orjson.loads(self.data)
            keys = list(fields)
            cut, end = keys.index("messages_after"), keys.index("messages") + 1
            head = orjson.dumps({k: fields[k] for k in keys[:cut]})
            tail = orjson.dumps({k: fields[k] for k in keys[end:]})
        return b'%b,"messages":null,%b,"truncated":true}' % (head[:-1], tail[1:-1])

    def messages_json(self) -> bytes | None:
        """The messages of an entry written whole (`data`), as JSON; None for any other."""
        data, head, tail = self.data, self.head, self.tail
        start = len(head) - 1 + len(_MESSAGES_KEY)
        if data is None or data[start - len(_MESSAGES_KEY):start] != _MESSAGES_KEY or (
                not data.endswith(tail[1:])) or data[start:start + 1] != b"[":
            return None
        return data[start:len(data) - len(tail)]

    @classmethod
    def of(cls, call: ModelCall, st: EpisodeState, reply: dict[str, Any] | None, *,
           full: bool, lazy: bool,
           after: tuple[int, int, int, list[Any]] | None = None) -> KeptTurn | LazyTurn:
        """An answered call's turn. `lazy`: its messages are read back from the body it was
        sent when they are asked for (when that body reads as the conversation it carried),
        and a non-streamed answer's fields from the body it came in; otherwise they are
        written now. `after` (call.logged_after, its earlier turn kept here): only the new
        messages are kept, written now (a long episode's entries do not grow with it)."""
        turn, attempt = turn_numbers(call, st)
        if after is not None:  # what follows an earlier turn's messages: written now, small
            return cls.following(turn, attempt, reply, call.disclosure_text,
                                 None if call.tokens is None else call.tokens.fields(), full,
                                 after)
        body = call.upstream_body
        # A body with integers orjson reads as floats (call.exact) is not read back: those
        # messages are written from the objects sent, as they always were.
        readable = lazy and body is not None and call.sent is not None and not call.exact
        if readable and call.events is None and call.data:
            assert body is not None
            return LazyTurn(turn, attempt, call.disclosure_text, exact(call.data),
                            call.dialect.read_body, exact(body), call.dialect.conversation,
                            full, call.tokens)
        head, tail = _head_tail(turn, attempt, reply, call.disclosure_text,
                                None if call.tokens is None else call.tokens.fields(), full)
        if readable:
            assert body is not None
            return cls(head, tail, body=exact(body), read=call.dialect.conversation, full=full,
                       numbers=(turn, attempt))
        kept = cls(head, tail, full=full, numbers=(turn, attempt))
        messages = None if call.sent is None else call.dialect.conversation(call.sent)
        if messages is not None and call.lossy:  # (never kept as what follows: `keep`)
            messages = exact_conversation(call, messages)
        kept.data = kept.written(messages)
        kept.count = None if messages is None else len(messages)
        return kept


    @classmethod
    def following(cls, turn: int, attempt: int, reply: dict[str, Any] | None,
                  text: str | None, tokens: dict[str, Any] | None, full: bool,
                  after: tuple[int, int, int, list[Any]]) -> KeptTurn:
        """The entry of a turn whose messages follow the first n of an earlier turn's (`after`:
        turn, attempt, n, its new messages), written in one go: the bytes `written` makes of
        `_head_tail`'s with `after`, which it falls back to for what orjson cannot write. Its
        head and tail are not kept beside them (`small` reads them back when it is needed)."""
        response = finish_reason = usage = None
        if reply is not None:
            response, finish_reason, usage = (
                reply.get("message"), reply.get("finish_reason"), reply.get("usage"))
        messages, told = after[3], text
        if not full:
            response, told, messages = strip_text(response), strip_text(text), strip_text(messages)
        fields = {"turn": turn, "attempt": attempt, "response": response,
                  "finish_reason": finish_reason, "usage": usage, "messages_after": after[:3],
                  "messages": messages, "disclosure_text": told}
        if tokens is not None:
            fields.update(tokens)
        try:
            data = orjson.dumps(fields)
        except TypeError:  # (an integer past 64 bits, nesting past 254 levels: as `written`)
            head, tail = _head_tail(turn, attempt, reply, text, tokens, full)
            kept = cls(head, tail, full=full, numbers=(turn, attempt))
            kept.data = exact(kept.written(after[3], after[:3]))
        else:
            kept = cls(b"", b"", data=exact(data), full=full, numbers=(turn, attempt))
        kept.after = after[:3]
        return kept


def _head_tail(turn: int, attempt: int, reply: dict[str, Any] | None, text: str | None,
               tokens: dict[str, Any] | None, full: bool) -> tuple[bytes, bytes]:
    """KeptTurn's fields around the messages, as JSON."""
    response = finish_reason = usage = None
    if reply is not None:
        response, finish_reason, usage = (
            reply.get("message"), reply.get("finish_reason"), reply.get("usage"))
    if not full:
        response, text = strip_text(response), strip_text(text)
    head = orjson.dumps({"turn": turn, "attempt": attempt, "response": response,
                         "finish_reason": finish_reason, "usage": usage})
    tail = orjson.dumps({"disclosure_text": text} if tokens is None else
                        {"disclosure_text": text, **tokens})
    return exact(head), exact(tail)


_MESSAGES_KEY = b',"messages":'

# What an entry holds beside the lengths of its bytes and text: its own object and their
# headers (traced: 331 bytes a KeptTurn with its turn numbers, 284 a LazyTurn;
# tests/proxy/test_kept_turns.py).
OVERHEAD = 336


def exact(data: bytes) -> bytes:
    """`data` in an allocation of its own length. orjson grows its output by doubling and
    returns it without shrinking (3.13: a 345 KB body in a 519 KB block, up to 2x), and a kept
    body outlives the call: a copy makes the bytes the log counts the bytes it holds."""
    return bytes(memoryview(data))


class LazyTurn:
    """A non-streamed turn in the memory log, kept as the bytes it was made of: the request
    body the upstream got and the body it answered with. Its KeptTurn, and so its JSON, is
    made when it is read (most are never read), not on the call's path."""

    __slots__ = ("turn", "attempt", "text", "answer", "reply_of", "body", "read", "full",
                 "tokens")

    def __init__(self, turn: int, attempt: int, text: str | None, answer: bytes,
                 reply_of: Callable[[bytes], dict[str, Any]], body: bytes,
                 read: Callable[[dict[str, Any]], list[Any]], full: bool,
                 tokens: Tokens | None = None) -> None:
        self.turn, self.attempt, self.text = turn, attempt, text
        self.answer, self.reply_of = answer, reply_of
        self.body, self.read, self.full = body, read, full
        self.tokens = tokens  # captured (the answer is then as the client got it)

    @property
    def size(self) -> int:
        size = len(self.body) + len(self.answer) + (len(self.text) if self.text else 0) + OVERHEAD
        return size if self.tokens is None else size + self.tokens.size

    def kept(self) -> KeptTurn:
        try:
            reply: dict[str, Any] | None = self.reply_of(self.answer)
        except Exception:  # as the call's own read-back (axis_calls.read_reply): no fields
            reply = None
        tokens = None if self.tokens is None else self.tokens.fields()
        try:
            head, tail = _head_tail(self.turn, self.attempt, reply, self.text, tokens, self.full)
        except (TypeError, ValueError):  # a reply orjson cannot write: kept without it
            head, tail = _head_tail(self.turn, self.attempt, None, self.text, tokens, self.full)
        return KeptTurn(head, tail, body=self.body, read=self.read, full=self.full)

    def encode(self) -> bytes:
        return self.kept().encode()

    def small(self) -> bytes:
        return self.kept().small()

    @property
    def numbers(self) -> tuple[int, int]:
        return self.turn, self.attempt

    after = None  # (always whole: the body sent)

    def whole(self) -> LazyTurn:
        return self


def with_rollout_group(scope: MutableMapping[str, Any], rollout_id: str) -> dict[str, Any]:
    """The scope of a call under /rollout/{rid}/attempt/{aid}/v1: its episode's task and group
    are the rollout's, unless its headers name others (read on the episode's first call)."""
    headers = list(scope["headers"])
    names = {k for k, _ in headers}
    value = rollout_id.encode("latin-1")
    for name in (b"x-episode-task", b"x-episode-group"):
        if name not in names:
            headers.append((name, value))
    return {**scope, "headers": headers}


class RolloutRecorder(Recorder):
    """A Recorder that also keeps each episode's group (joined when it starts, its waiters
    woken when it ends: once per episode across replicas, as its record is written) and,
    with a turn log, every answered turn with the messages the upstream got."""

    def __init__(self, sink: TrajectorySink, metrics: Metrics | None, content_full: bool,
                 groups: GroupStore, turns: TurnLog | None) -> None:
        super().__init__(sink, metrics, content_full)
        self.groups = groups
        self.turns = turns
        # The memory log keeps entries as they are (bytes they share with the call): their
        # messages are read back from the body sent when the trajectory is asked for.
        self.lazy = isinstance(turns, MemoryTurnLog)
        if turns is not None:
            self.keeps_turns = True
        # Each recent episode's last turn kept here, (turn, attempt): a later turn's entry
        # keeps only its new messages when the upstream's conversation extends that turn's.
        self._last_kept: dict[str, tuple[int, int, bool]] = {}  # (and whether read again)
        # An entry written whole: its messages' JSON (without the closing bracket) and their
        # count, for the episode's next entry to be compared with (`_rebased`).
        self._written: OrderedDict[str, tuple[int, int, bytes, int]] = OrderedDict()
        self._written_bytes = 0
        self.forget.append(self._forget)
        # Live experiments keep each of their episodes' outcomes as its record is written.
        self.experiments: Experiments | None = None

    def _forget(self, episode_id: str) -> None:
        """An ended episode's last entries: no turn of it follows them."""
        self._last_kept.pop(episode_id, None)
        written = self._written.pop(episode_id, None)
        if written is not None:
            self._written_bytes -= len(written[2])

    async def keep(self, call: ModelCall, st: EpisodeState,
                   reply: dict[str, Any] | None) -> None:
        """Keep an answered turn for its episode's trajectory (with a turn log)."""
        eid = call.episode_id
        if self.turns is None or eid is None:
            return
        after = call.logged_after
        last = self._last_kept.pop(eid, None)  # (re-inserted below: the most recent last)
        # That turn's entry must be kept here, and its messages written from values read as
        # these are (orjson's reading; a call read again keeps its entry whole): integers
        # past 64 bits that differ can read as the same float, so only a turn read without
        # loss, or one whose messages were written from orjson's reading too, agrees.
        read_again = call.exact or call.lossy  # (its messages written exact, whole)
        if after is not None and (last is None or last[:2] != after[:2] or read_again or not (
                after[4] or not last[2])):
            after = None
        # The memory log says now what its last entry with messages is (it may have dropped
        # the episode since); Redis checks when the entry arrives, and takes it whole if not.
        tip = self.turns.tip(eid) if isinstance(self.turns, MemoryTurnLog) else None
        if after is not None and self.lazy and tip != after[:2]:
            after = None
        full = self.content_full
        try:
            kept = KeptTurn.of(call, st, reply, full=full, lazy=self.lazy,
                               after=None if after is None else after[:4])
        except (TypeError, ValueError):  # a reply orjson cannot write (nested too deep)
            log.warning("turn of %s not kept for its trajectory: its reply cannot be "
                        "written as JSON", eid)
            return
        if after is not None and not self.lazy and isinstance(kept, KeptTurn):
            kept.again = lambda: KeptTurn.of(call, st, reply, full=full, lazy=False)
        numbers = turn_numbers(call, st)
        written = self._written.pop(eid, None)
        if written is not None:
            self._written_bytes -= len(written[2])
            if self.lazy and tip != written[:2]:
                written = None
        if isinstance(kept, KeptTurn) and after is None:
            kept = self._rebased(eid, kept, numbers, written)
        try:
            await self.turns.append(eid, kept)
        except StoreUnavailable:
            log.warning("store unavailable: turn %s of %s not kept for its trajectory",
                        numbers[0], eid)
            self._written.pop(eid, None)
            return
        kept_last = self._last_kept
        kept_last[eid] = (*numbers, read_again)
        if len(kept_last) > LAST_KEPT:
            del kept_last[next(iter(kept_last))]

    def _rebased(self, eid: str, kept: KeptTurn, numbers: tuple[int, int],
                 previous: tuple[int, int, bytes, int] | None) -> KeptTurn:
        """An entry written whole, as what follows the episode's previous entry written whole
        here when its messages' JSON starts with all of that one's, byte for byte (whatever
        the API: a Messages turn's texts go on messages whose markers move, so no proof
        from the client's bytes reaches it); the entry as it is otherwise. Remembers its
        messages for the next one (at most WRITTEN_BYTES in all, least recent dropped)."""
        text = kept.messages_json()
        if text is None:
            return kept
        count = kept.count
        if count is not None and len(text) <= WRITTEN_BYTES:
            self._written[eid] = (*numbers, text[:-1], count)
            self._written_bytes += len(text) - 1
            while self._written_bytes > WRITTEN_BYTES:
                self._written_bytes -= len(self._written.popitem(last=False)[1][2])
        if previous is None:
            return kept
        turn, attempt, head, n = previous
        if n < 1 or not starts_with(text, head):
            return kept
        rebased = KeptTurn(kept.head, kept.tail, full=kept.full, numbers=kept.numbers)
        rebased.data = b'%b,"messages_after":[%d,%d,%d],"messages":[%b,%b' % (
            kept.head[:-1], turn, attempt, n, text[len(head) + 1:], kept.tail[1:])
        rebased.after = (turn, attempt, n)
        if not self.lazy:  # (the memory log checked what it follows before; Redis checks after)
            rebased.again = lambda: kept
        return rebased

    async def episode_started(self, st: EpisodeState) -> None:
        await super().episode_started(st)
        key = group_key(st)
        if key is not None:
            try:
                await self.groups.join(key, st.episode_id)
            except StoreUnavailable:
                log.warning("store unavailable: episode %s not added to its group",
                            st.episode_id)

    async def episode_ended(self, st: EpisodeState) -> None:
        if st.experiment is not None and self.experiments is not None:
            # (before the record: an episode whose record is written is in the tally)
            await self.experiments.ended(st)
        await super().episode_ended(st)
        key = group_key(st)
        if key is not None:
            try:
                await self.groups.ended(key)
            except StoreUnavailable:
                log.warning("store unavailable: the end of %s woke no group waiter",
                            st.episode_id)
