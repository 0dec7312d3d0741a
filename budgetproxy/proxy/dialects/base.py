"""The one Protocol every call kind's dialect speaks: what the hot path asks of an API."""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from budgetproxy.core.disclosure import Disclosed, Placement
from budgetproxy.core.prefixes import Raw
from budgetproxy.errors import ProxyError

# What a reply read back gives the log, metrics and spans:
# {"message": {role, content (text or None), tool_calls?, ...}, "finish_reason", "usage"}
Reply = dict[str, Any]
EMPTY_REPLY: Reply = {"message": None, "finish_reason": None, "usage": None}


class Read(NamedTuple):
    """A counted call's conversation as `Dialect.conversation_from` reads it."""

    conversation: list[Any]
    raw: Raw | None  # for the episode's next turn (None: the dialect keeps none)
    proven: int  # the payload's items byte for byte those of the `earlier` turn (0: none)
    # The payload's items after the `proven` ones (all, when none is), as orjson writes them,
    # hold no `e+`: no float an integer past 64 bits became among them (False: not known).
    floatless: bool = False


def read_whole(conversation: list[Any]) -> Read:
    """A conversation read whole, by a dialect that keeps no `Raw`."""
    return Read(conversation, None, 0)


class Dialect(Protocol):
    """One API (chat, completions, responses, messages), as the hot path needs to know it.

    The conversation is the list the proxy fingerprints, logs and places disclosure texts in
    by index; a dialect may put a head item first (the instructions or the system prompt) so
    a change to it shows as a rewritten conversation.
    """

    kind: str
    # Head items the conversation starts with (instructions, system prompt) before messages.
    heads: int
    # The payload's member whose items the conversation's messages are read from (the same
    # objects where nothing in them changed); None when there is no such list.
    items_key: str | None
    # Whether disclosed episodes get the text placed on this API (see `place`).
    discloses: bool
    # Whether a `kind: litellm` upstream can serve it (litellm.acompletion takes chat).
    via_litellm: bool
    # Ask the upstream for usage on streams (stream_options.include_usage) and drop the extra
    # chunk when the client did not ask for it.
    stream_usage: bool

    def validate(self, payload: dict[str, Any]) -> None:
        """Raise invalid_request when a field this API needs is missing or mistyped."""

    def conversation(self, payload: dict[str, Any]) -> list[Any]:
        """The conversation a payload carries, as the client sent it."""

    def conversation_from(self, payload: dict[str, Any], earlier: Raw | None) -> Read:
        """`conversation`, with the entries that `earlier` (the episode's previous turn's
        `Raw`) proves unchanged taken from it; and this turn's `Raw`, for a dialect that
        keeps one (core/prefixes.py)."""

    def continues(self, payload: dict[str, Any]) -> str | None:
        """The id of a response stored upstream that this call continues (Responses)."""

    def placement_index(self, placement: Placement, conversation: list[Any]) -> int | None:
        """The conversation index a turn's text attaches to; None when not replayed."""

    def place(
        self, payload: dict[str, Any], conversation: list[Any], placement: Placement, text: str,
        again: list[tuple[int, str]], previous: Disclosed | None = None, proven: int = 0,
    ) -> tuple[dict[str, Any], Disclosed | None]:
        """The payload with this turn's text placed and earlier ones (index, text) re-applied;
        what it does not touch stays the client's own objects. With it, what the episode's
        next turn may start from when its conversation starts with this one's (`previous`:
        the previous turn's; core.disclosure.placed_last), or None. `proven`: how many of the
        payload's items are, byte for byte, those of the `previous` turn's (its `Raw`)."""

    def kept_after(self, placed: Disclosed) -> tuple[int, list[Any]]:
        """For a turn whose placed items start with `placed.base` of the previous turn's: how
        many entries of the conversation the upstream got are that turn's, and the entries
        after them (its turn log entry keeps only those, proxy/grouping.py)."""

    def read_body(self, data: bytes) -> Reply:
        """The reply in a whole (non-streamed) response body."""

    def read_parsed(self, obj: Any) -> Reply:
        """`read_body` of a body already parsed."""

    def read_events(self, events: list[bytes]) -> Reply:
        """The reply in a streamed response's SSE events."""

    def ends_stream(self, event: bytes) -> bool:
        """Whether an SSE event is the one that ends a whole answer's stream (a client may
        hang up once it has it: that turn was answered in full)."""

    def synthetic(
        self, model: str, finish_reason: str, stream: bool, payload: dict[str, Any], text: str,
    ) -> tuple[bytes, bytes]:
        """Content type and body of the final reply of an exhausted episode (finish mode),
        an assistant message saying `text`."""

    def error_body(self, err: ProxyError) -> bytes:
        """An error the proxy itself answers, in this API's shape."""

    def upstream_key_header(self, api_key: str) -> tuple[str, str]:
        """The header that carries the upstream's own key."""

    def log_fields(self, conversation: list[Any], seen: int) -> dict[str, Any]:
        """The turn record's request_messages and messages_offset for the conversation from
        index `seen` on, and any head field it logs (instructions, system)."""


def head_log_fields(conversation: list[Any], seen: int, field: str) -> dict[str, Any]:
    """log_fields for a conversation whose item 0 is a head `{field: value}` (the instructions
    or system prompt): logged as `field` when the conversation is logged whole (its first
    turn, or one whose head or history changed), its items' offsets counted without it."""
    if not conversation:
        return {"request_messages": [], "messages_offset": 0}
    if seen == 0:
        out: dict[str, Any] = {"request_messages": conversation[1:], "messages_offset": 0}
        head = conversation[0].get(field) if isinstance(conversation[0], dict) else None
        if head is not None:
            out[field] = head
        return out
    return {"request_messages": conversation[seen:], "messages_offset": seen - 1}


def lone_text(conversation: list[Any], heads: int) -> str | None:
    """The text of a conversation's only user message (string content, or its text parts),
    stripped; None when it holds more, or other, messages."""
    if len(conversation) != heads + 1:
        return None
    m = conversation[heads]
    if not isinstance(m, dict) or m.get("role", "user") != "user":
        return None
    content = m.get("content")
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        texts = [t for t in parts if isinstance(t, str)]
        if not texts or len(texts) != len(content):
            return None
        content = "".join(texts)
    return content.strip() if isinstance(content, str) else None
