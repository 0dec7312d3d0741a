"""One model call: its state through the handler, and the turn record it leaves."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from blake3 import blake3

from budgetproxy.config import UpstreamConfig
from budgetproxy.core import prefixes
from budgetproxy.core.disclosure import Disclosed
from budgetproxy.core.episode import EpisodeState, Grant, GrantKind
from budgetproxy.core.fingerprint import Fingerprint
from budgetproxy.core.prefixes import CheckedOthers, Prefix, Raw, SentBody
from budgetproxy.proxy.capture import Capture, Tokens
from budgetproxy.proxy.dialects import Dialect
from budgetproxy.proxy.outcome import ANSWERED
from budgetproxy.proxy.wire import Checked, exact_payload, others, read_exact
from budgetproxy.telemetry.tracing import CallTrace
from budgetproxy.trajectories.records import SCHEMA_VERSION, rfc3339

if TYPE_CHECKING:  # (upstream_call.py imports this module)
    from budgetproxy.proxy.upstream_call import Leg


def turn_hash(route: str, body: bytes) -> str:
    """What makes a resend "the same call": the same route with a byte-identical body."""
    # BLAKE3: every episode call hashes its whole body, ~50 µs for a 345 KB one against
    # ~220 µs with SHA-256 (SHA extensions included) and ~400 µs with BLAKE2b. A resend sent
    # across an upgrade from a version that used SHA-256 is charged as a new turn.
    h = blake3(route.encode() + b"\0")
    h.update(body)
    return h.hexdigest(16)


# A call carrying this header is a probe's (budgetproxy probe): it names no episode (one that
# does is refused), is forwarded, and is logged as a "probe" record; the value names the run.
PROBE_HEADER = b"x-budgetproxy-probe"

_STREAM_USAGE = b',"stream_options":{"include_usage":true}}'


def with_stream_usage(body: bytes) -> bytes:
    """A JSON object's bytes (one with at least one member, and no stream_options) with
    `"stream_options": {"include_usage": true}` added as its last member."""
    end = body.rindex(b"}")
    return body[:end] + _STREAM_USAGE + body[end + 1:]


class ModelCall:
    """One model call as forward.py learns it: what admission found (route, model, episode,
    grant), what the upstream leg returned (upstream_call.py `Leg`) and its `outcome`. The
    phases return values; only the model-call path (forward.py, with its admission.py and
    turns.py) writes them here."""

    __slots__ = (
        "t0", "route", "dialect", "kind", "model", "stream", "episode_id", "state", "grant",
        "upstream", "t_upstream", "started", "outcome", "disclosure_text",
        "conversation", "data", "events",
        "settled", "span", "prints", "previous_response", "exact", "ended", "probe", "query",
        "payload", "timed_out", "cumulative", "capture", "tokens", "sent", "upstream_body",
        "counts", "answer", "warning", "compaction", "leg", "written", "extends", "lossless",
        "lossy", "placed", "logged_after", "raw", "raw_proven", "raw_from", "sent_body",
        "floatless",
    )

    def __init__(self, route: str, dialect: Dialect) -> None:
        self.t0 = time.perf_counter()
        self.route = route
        self.dialect = dialect
        self.kind = dialect.kind
        self.model: str | None = None
        self.stream = False
        self.episode_id: str | None = None
        self.state: EpisodeState | None = None
        self.grant: Grant | None = None
        self.upstream: UpstreamConfig | None = None
        self.t_upstream = 0.0
        self.started = False
        # its status, HTTP status and settle result, as proxy/outcome.py decides them; only
        # forward.py (and turns.py, for a spent budget's answer) sets it, from what each
        # phase returns
        self.outcome = ANSWERED
        self.disclosure_text: str | None = None
        self.conversation: list[Any] | None = None
        self.data: bytes | None = None
        self.events: list[bytes] | None = None
        self.settled = False
        self.span: CallTrace | None = None
        self.prints: Fingerprint | None = None  # of the conversation, when the call needs it
        # previous_response_id of a /v1/responses call continuing a response stored upstream
        self.previous_response: str | None = None
        self.exact = False  # the payload was read again to keep integers past 64 bits
        # checked for integers orjson read as floats (wire.exact_payload) and found none
        self.lossless = False
        # its conversation holds such a float though its body went as the client wrote it
        # (the hidden arm's; a litellm upstream's is never: it gets orjson's reading; turns.py
        # `_keep_prefix`): its record and kept turn are written whole, read again exact
        # (`exact_conversation`)
        self.lossy = False
        # the conversation as written (core.prefixes), and the previous turn's, kept by this
        # process, when this one starts with it
        self.written: bytes | None = None
        self.extends: Prefix | None = None
        # its body up to its last message, for the next turn (a Messages call's: core/prefixes.py
        # `Raw`), and how many of its items are byte for byte those of the turn `raw_from`
        self.raw: Raw | None = None
        self.raw_proven = 0
        self.raw_from: Prefix | None = None
        # its body's items past the `raw_proven` ones hold no float an integer past 64 bits
        # became, as their writing shows (dialects/base.py `Read`)
        self.floatless = False
        # its conversation with the disclosure texts placed, for the next turn to start from
        self.placed: Disclosed | None = None
        # where the body the upstream gets is kept for the next turn (its episode's Prefix's)
        self.sent_body: SentBody | None = None
        # (turn, attempt, n, new messages, lossless): the conversation the upstream got is the
        # first n messages of that earlier turn's, then these (its kept entry holds only
        # these), its values read as that turn's were, or that turn's read without loss
        self.logged_after: tuple[int, int, int, list[Any], bool] | None = None
        self.ended: EpisodeState | None = None  # its episode, when settling this call ended it
        self.probe: str | None = None  # the probe run that sent it (PROBE_HEADER)
        self.query = ""  # the query string forwarded upstream with it (core.paths.wire_query)
        self.payload: dict[str, Any] | None = None  # as parsed (or clamped, core.axes)
        self.timed_out = False  # its episode's time budget ended it (core.axes)
        self.cumulative: dict[str, Any] | None = None  # spend per axis once settled
        self.capture: Capture | None = None  # token capture asked of the upstream
        self.tokens: Tokens | None = None  # what it sampled, read back
        self.answer: Any = None  # its answer parsed, when capture read it (as the client got it)
        # input and output tokens of its usage, once read (None: not read yet)
        self.counts: tuple[int | None, int | None] | None = None
        # the payload as the upstream got it, for the conversation it sent: read from it only
        # when a kept turn needs it (a long episode's conversation is a walk of its history)
        self.sent: dict[str, Any] | None = None
        # The request body the upstream got, `sent` written (the memory turn log keeps it and
        # reads its conversation back when asked, proxy/grouping.py).
        self.upstream_body: bytes | None = None
        # X-Episode-Warning: first-call headers this later call sent that its episode ignored
        self.warning: bytes | None = None
        self.compaction = False  # a CLI's compaction call (core/compaction.py)
        self.leg: Leg | None = None  # the upstream leg's, once kept (forward.py `_forward`)


def micros(seconds: float) -> float:
    """Seconds to the microsecond: what round(seconds, 6) gives (but on a tie the float
    product rounds), at a fraction of its cost (no decimal conversion)."""
    return round(seconds * 1_000_000) / 1_000_000


def turn_numbers(call: ModelCall, st: EpisodeState) -> tuple[int, int]:
    """The call's turn and attempt; a call refused is the turn it would have been."""
    grant = call.grant
    if grant is not None and grant.kind is GrantKind.FORWARD:
        return grant.turn, grant.attempt
    return st.turns_used + 1, 1 if grant is None else grant.attempt


def turn_record(
    call: ModelCall, st: EpisodeState, conversation: list[Any] | None,
    reply: dict[str, Any] | None, charged: bool, remaining: int | None,
) -> dict[str, Any]:
    """The call's turn record (docs/trajectories.md), with `charged` and `remaining` as
    its turn settled. Its messages are only what is new since the previous turn, while the
    conversation grows append-only; one rewritten or shrunk is logged whole, from 0. So is the
    input of a call that continues a stored response (the client sends only what is new, all
    of it), and a retry (a later attempt of a turn): each record reads on its own."""
    grant = call.grant
    if grant is not None and grant.kind is GrantKind.FORWARD:
        seen, digest, turn = grant.messages_seen, grant.messages_digest, grant.turn
    else:
        seen, digest, turn = st.messages_seen, st.messages_digest, st.turns_used + 1
    attempt = 1 if grant is None else grant.attempt
    msgs = conversation or []
    prints = call.prints
    # (a conversation with integers past 64 bits is logged whole: one changed to another
    # that orjson reads as the same float leaves the digests equal)
    if seen and (attempt > 1 or prints is None or call.previous_response is not None
                 or call.exact or call.lossy or seen > len(msgs) or not prints.extends(digest)):
        seen = 0
    if call.lossy:
        msgs = exact_conversation(call, msgs)
    response, finish_reason, usage = (None, None, None) if reply is None else (
        reply.get("message"), reply.get("finish_reason"), reply.get("usage"))
    record: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "type": "turn",
        "episode_id": call.episode_id,
        "turn": turn,
        "attempt": attempt,
        "ts": rfc3339(time.time()),
        "latency_s": round((time.perf_counter() - call.t0) * 1_000_000) / 1_000_000,  # micros
        "model": call.model,
        "route": call.route,
        "stream": call.stream,
        "status": call.outcome.status,
        "http_status": call.outcome.http_status,
        **call.dialect.log_fields(msgs, seen),
        "response": response,
        "finish_reason": finish_reason,
        "usage": usage,
        "budget": st.budget,
        "remaining": remaining,
        "cumulative": call.cumulative or {
            "turns": st.turns_used if remaining is None else st.budget - remaining,
            "tokens": None, "cost": None, "seconds": None},
        "charged": charged,
        "disclosure": {"arm": st.disclosure, "text": call.disclosure_text},
        "task_id": st.task_id,
        "group": st.group,
    }
    if call.previous_response is not None:  # what the logged input continues
        record["previous_response_id"] = call.previous_response
    if st.experiment is not None:
        record["experiment"], record["arm"] = st.experiment, st.arm
    if call.compaction:  # a counted compaction call (episodes.compaction: counted)
        record["compaction"] = True
    if call.tokens is not None:
        record.update(call.tokens.fields())
    return record


def compaction_record(call: ModelCall, reply: dict[str, Any]) -> dict[str, Any]:
    """A free compaction call's record: the episode it summarised for, the whole conversation
    it sent and the summary (no turn spent)."""
    return {
        **_call_fields(call, "compaction"),
        "episode_id": call.episode_id,
        **call.dialect.log_fields(call.conversation or [], 0),
        **_reply_fields(reply),
        "charged": False,
    }


def probe_record(call: ModelCall, reply: dict[str, Any]) -> dict[str, Any]:
    """A probe call's record: the whole conversation it sent and the reply (no episode)."""
    return {
        **_call_fields(call, "probe"),
        "probe_id": call.probe,
        "request_messages": call.conversation or [],
        **_reply_fields(reply),
    }


def _call_fields(call: ModelCall, kind: str) -> dict[str, Any]:
    """What every record of a call outside an episode's turns carries about the call."""
    return {
        "schema": SCHEMA_VERSION,
        "type": kind,
        "ts": rfc3339(time.time()),
        "latency_s": micros(time.perf_counter() - call.t0),
        "model": call.model,
        "route": call.route,
        "stream": call.stream,
        "status": call.outcome.status,
        "http_status": call.outcome.http_status,
    }


def _reply_fields(reply: dict[str, Any]) -> dict[str, Any]:
    return {"response": reply.get("message"), "finish_reason": reply.get("finish_reason"),
            "usage": reply.get("usage")}


def exact_conversation(call: ModelCall, conversation: list[Any]) -> list[Any]:
    """The conversation of a `lossy` call, whose body went upstream as the client wrote it,
    as the upstream got it: read again from those bytes keeping the integers past 64 bits that
    orjson's reading (`conversation`) turned into floats. (A body the proxy rewrote was read
    again before it was written: `exact`.)"""
    body = call.upstream_body
    exact = None if body is None or call.exact else read_exact(body)
    if exact is None:
        return conversation
    try:
        read = call.dialect.conversation(exact)
    except (KeyError, TypeError, ValueError):
        return conversation
    return read if len(read) == len(conversation) else conversation


def _without_large_floats(written: bytes | None, start: int) -> bool:
    """Whether the JSON that orjson wrote (`written`, from `start`) holds no float of 1e16
    or more: orjson writes each such float with an exponent ("1.1805916207174113e+21"), and
    a parsed integer past 64 bits is such a float (one past a double's range is refused as
    it is read). Its bytes without "e+" (a text may hold it too: then the values are walked)
    prove no integer past 64 bits among the values they were written from."""
    return written is not None and written.find(b"e+", start) < 0


def exact_payload_for(call: ModelCall, body: bytes, payload: dict[str, Any],
                      checked_others: CheckedOthers) -> dict[str, Any] | None:
    """The payload to rewrite, read again when orjson's reading lost an integer's
    digits (the rewrite must not change what it does not touch); None: `payload` is.
    The messages the previous turn checked are not looked at again (core/prefixes.py), nor
    other values this process has checked before (`checked_others`)."""
    previous, prints, dialect = call.extends, call.prints, call.dialect
    key = dialect.items_key
    # (written only for a turn that keeps its conversation for the next: core/prefixes.py)
    written = None if call.written is None else prefixes.written(others(payload, key))
    known = written is not None and written in checked_others
    checked = None
    if previous is not None and previous.lossless and prints is not None:
        if known and key is not None and dialect.heads == 0 and (
                prints.messages is payload.get(key)) and (
                _without_large_floats(call.written, len(previous.written) - 1)):
            call.exact, call.lossless = False, True  # (what the walk below would find)
            return None
        if known and call.floatless and call.raw_from is previous:
            # (a Messages call: its items past those its Raw proves the previous turn's, as
            # orjson wrote them with their markers, hold no `e+`; the proven ones are that
            # turn's, which it checked)
            call.exact, call.lossless = False, True
            return None
        checked = Checked(prints.messages, previous.messages, key, dialect.heads, known,
                          call.raw_proven if call.raw_from is previous else 0)
    elif known and prints is not None:  # (no message checked: only the other values)
        checked = Checked(prints.messages, 0, key, dialect.heads, True)
    exact, lossy = exact_payload(body, payload, checked)
    call.exact = exact is not None
    call.lossless = not lossy
    if written is not None and not lossy and not known:
        checked_others.add(written)
    return exact
