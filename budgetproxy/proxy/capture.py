"""Token capture: ask a vLLM or SGLang server for sampled token ids and logprobs, give the
client its answer as it would be without them, and read them back for the turn's record."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from budgetproxy.proxy.sse import event_data

Server = Literal["vllm", "sglang"]
# The APIs whose OpenAI-compatible servers return token ids (vLLM and SGLang both serve
# chat and text completions with them; neither returns them on /v1/responses or /v1/messages).
CAPTURED_KINDS = frozenset({"chat", "completions"})

# A JSON string (escapes included) or one bracket: enough to find where a value ends.
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')
_SCALAR_END = re.compile(rb"[,}\]]")
_WHITESPACE = b" \t\r\n"
_DECODER = json.JSONDecoder()
# A member's key and its colon; JSON allows whitespace between them (`"logprobs" :`).
_FIELD = re.compile(rb'"(prompt_token_ids|token_ids|logprobs)"[ \t\r\n]*:')
# What vLLM's chunk that carries only token ids or logprobs holds once they are stripped.
_EMPTY_DELTA = re.compile(rb'"delta"[ \t\r\n]*:[ \t\r\n]*\{[ \t\r\n]*\}')
_NULL_FINISH = re.compile(rb'"finish_reason"[ \t\r\n]*:[ \t\r\n]*null')


@dataclass(slots=True)
class Capture:
    """A capture plan: what the proxy adds to a call's request, so it is taken out of the
    answer again (one per kind of call and what its client asked for, shared by its calls)."""

    kind: str
    server: Server
    strip_ids: bool  # the client did not ask for token ids
    strip_logprobs: bool  # the client did not ask for logprobs
    # the client did not ask for prompt token ids (vLLM: with the others; SGLang's chat asks
    # for them apart, with return_prompt_token_ids)
    strip_prompt_ids: bool | None = None
    # the fields the server writes as null when not asked for them (set from the above)
    null_keys: frozenset[bytes] = frozenset()
    members: bytes = b""  # the request fields the plan adds, written as JSON members

    @property
    def strips(self) -> bool:
        return self.strip_ids or self.strip_logprobs or bool(self.strip_prompt_ids)

    def __post_init__(self) -> None:
        if self.strip_prompt_ids is None:
            self.strip_prompt_ids = self.strip_ids
        keys = {b"logprobs"} if self.strip_logprobs else set()
        if self.server == "vllm":
            if self.strip_ids:
                keys.add(b"token_ids")
            if self.strip_prompt_ids:
                keys.add(b"prompt_token_ids")
        self.null_keys = frozenset(keys)


def plan(payload: dict[str, Any], kind: str, server: Server) -> tuple[Capture, dict[str, Any]]:
    """The capture for a call of `kind`, and the request fields to add (none when the client
    asked for everything itself). Both are shared between calls: read them, never change them."""
    asked_ids = payload.get("return_token_ids") is True
    lp = payload.get("logprobs")
    if kind == "chat":
        asked_lp = lp is True
    else:  # completions: logprobs is the number of alternatives; 0 gives the sampled token's
        asked_lp = type(lp) is int and lp >= 0
    asked_prompt = asked_ids
    sglang_chat_stream = False
    if server == "sglang" and kind == "chat":
        asked_prompt = payload.get("return_prompt_token_ids") is True
        sglang_chat_stream = payload.get("stream") is True
    key = (kind, server, asked_ids, asked_lp, asked_prompt, sglang_chat_stream)
    planned = _PLANS.get(key)
    if planned is None:
        planned = _PLANS[key] = _plan(*key)
    return planned


def _plan(kind: str, server: Server, asked_ids: bool, asked_lp: bool,
          asked_prompt: bool, sglang_chat_stream: bool) -> tuple[Capture, dict[str, Any]]:
    add: dict[str, Any] = {}
    if sglang_chat_stream:
        # SGLang refuses return_token_ids and return_prompt_token_ids on a streamed chat call
        # (400, serving_chat.py: "not supported with streaming"); its chunks carry logprobs.
        if not asked_lp:
            add["logprobs"] = True
        members = b"".join(b',"%s":%s' % (k.encode(), orjson.dumps(v)) for k, v in add.items())
        return Capture(kind, server, False, not asked_lp, False, members=members), add
    if not asked_ids:
        add["return_token_ids"] = True
    if not asked_lp:
        add["logprobs"] = True if kind == "chat" else 0
    if server == "sglang" and kind == "chat" and not asked_prompt:
        add["return_prompt_token_ids"] = True
    members = b"".join(b',"%s":%s' % (k.encode(), orjson.dumps(v)) for k, v in add.items())
    return Capture(kind, server, not asked_ids, not asked_lp, not asked_prompt,
                   members=members), add


# (kind, server, what the client asked for, an SGLang chat stream) -> plan: a few dozen at most
_PLANS: dict[tuple[str, str, bool, bool, bool, bool], tuple[Capture, dict[str, Any]]] = {}


def add_fields(body: bytes, payload: dict[str, Any], add: dict[str, Any],
               members: bytes) -> bytes:
    """The body with `add` (written as `members`, the plan's `Capture.members`) as extra
    members when none of them is in it yet (its other bytes unchanged); b"" when one is there
    (the caller re-encodes `payload`, now updated)."""
    present = not add.keys().isdisjoint(payload)
    payload.update(add)
    if present or not body:
        return b""
    end = body.rindex(b"}")
    return body[:end] + members + body[end:]


def _value_end(buf: bytes, start: int, parsed: dict[int, Any] | None = None) -> int:
    """The index just past the JSON value that starts at `start` (an object read whole on the
    way is kept in `parsed`, by its start)."""
    first = buf[start:start + 1]
    if first == b"[":  # token ids: a flat array of numbers, found in one scan
        close = buf.find(b"]", start)
        if close >= 0 and not any(c in buf[start + 1:close] for c in (b"[", b"{", b'"')):
            return close + 1
    elif first == b"{":  # logprobs: orjson finds the end, else the standard library's decoder
        end = _followed_end(buf, start, parsed)
        if end is not None:
            return end
        end = _object_end(buf, start)
        if end is not None:
            return end
        try:
            text = buf[start:].decode()
            _, end = _DECODER.raw_decode(text)
        except (UnicodeDecodeError, ValueError):
            pass
        else:
            return start + len(text[:end].encode())
    elif first != b'"':
        m = _SCALAR_END.search(buf, start)
        return m.start() if m else len(buf)
    depth = 0
    for m in _TOKEN.finditer(buf, start):
        tok = m.group()
        if tok in (b"[", b"{"):
            depth += 1
        elif tok in (b"]", b"}"):
            depth -= 1
        if depth == 0:
            return m.end()
    return len(buf)


# What follows a choice's logprobs in vLLM's and SGLang's answers. Inside a JSON string a
# quote is escaped, so these bytes occur only between members.
_NEXT_MEMBER = b',"finish_reason":'


def _followed_end(buf: bytes, start: int, parsed: dict[int, Any] | None) -> int | None:
    """Where the object at `start` ends when the next `"finish_reason"` member follows it:
    the bytes up to there read whole by orjson (a prefix of an object is never a whole
    document, so a successful read ends exactly there). None: not so."""
    cand = buf.find(_NEXT_MEMBER, start)
    if cand < 0:
        return None
    end = cand
    while end > start and buf[end - 1] in _WHITESPACE:
        end -= 1
    try:
        obj = orjson.loads(memoryview(buf)[start:end])
    except orjson.JSONDecodeError:
        return None
    if parsed is not None:
        parsed[start] = obj
    return end


def _object_end(buf: bytes, start: int) -> int | None:
    """Where the JSON value at `start` ends, read by orjson: its error for what follows a
    whole value says where that begins (in characters). None when the value is not whole."""
    try:
        orjson.loads(memoryview(buf)[start:])
    except orjson.JSONDecodeError as e:
        if "after document" not in e.msg and "trailing" not in e.msg:
            return None
        pos = e.pos
    else:
        return len(buf)
    if not buf.isascii():  # characters to bytes
        try:
            pos = len(buf[start:].decode()[:pos].encode())
        except UnicodeDecodeError:
            return None
    end = start + pos
    while end > start and buf[end - 1] in _WHITESPACE:
        end -= 1
    return end


def _members(buf: bytes, key: bytes) -> list[tuple[int, int, int]]:
    """(member start, value start, value end) of every `"key": value` member, in order. A key
    can only be matched outside strings: inside one its quotes would be escaped."""
    needle = re.compile(rb'"%b"[ \t\r\n]*:' % re.escape(key))
    out = []
    found = needle.search(buf)
    while found is not None:
        vstart = found.end()
        while buf[vstart:vstart + 1] in (b" ", b"\t", b"\r", b"\n") and vstart < len(buf):
            vstart += 1
        vend = _value_end(buf, vstart)
        out.append((found.start(), vstart, vend))
        found = needle.search(buf, vend)
    return out


def _null_members(buf: bytes, keys: frozenset[bytes],
                  cut: list[tuple[bytes, int, int]] | None = None,
                  parsed: dict[int, Any] | None = None) -> bytes:
    """`buf` with the value of every member named in `keys` written as null, in one pass;
    each value replaced is listed in `cut` (key, start, end) when it is given."""
    out: list[bytes] = []
    pos = 0
    for m in _FIELD.finditer(buf):
        if m.start() < pos or m.group(1) not in keys:
            continue  # inside a value already replaced, or a field kept
        vstart = m.end()
        while buf[vstart:vstart + 1] in (b" ", b"\t", b"\r", b"\n") and vstart < len(buf):
            vstart += 1
        if buf.startswith(b"null", vstart):
            continue
        out.append(buf[pos:vstart])
        out.append(b"null")
        pos = _value_end(buf, vstart, parsed)
        if cut is not None:
            cut.append((m.group(1), vstart, pos))
    if not out:
        return buf
    out.append(buf[pos:])
    return b"".join(out)


def _drop_member(buf: bytes, key: bytes) -> bytes:
    """`buf` without any `"key": value` member (and the comma that joined it)."""
    while True:
        found = _members(buf, key)
        if not found:
            return buf
        start, _, end = found[0]
        before = buf[:start].rstrip(_WHITESPACE)
        if before.endswith(b","):
            buf = before[:-1] + buf[end:]
        else:
            after = buf[end:].lstrip(_WHITESPACE)
            buf = buf[:start] + (after[1:] if after.startswith(b",") else after)


def strip(data: bytes, cap: Capture) -> bytes:
    """A body or event as the server writes it when not asked for what the proxy added:
    vLLM writes `null` for token ids and logprobs it was not asked for; SGLang leaves token
    ids out and writes `null` logprobs. (SGLang's chat API asks for prompt ids apart, with
    `return_prompt_token_ids`, its text completions with `return_token_ids`.)"""
    if cap.server == "sglang" and data.find(b'token_ids"') >= 0:
        if cap.strip_prompt_ids:
            data = _drop_member(data, b"prompt_token_ids")
        if cap.strip_ids:
            data = _drop_member(data, b"token_ids")
    keys = cap.null_keys
    return _null_members(data, keys) if keys else data


_ALL = frozenset({b"logprobs", b"token_ids", b"prompt_token_ids"})


def strip_body(data: bytes, cap: Capture) -> tuple[bytes, Tokens | None, Any]:
    """`strip` of a whole body, the tokens read from what it took out, and the parse of the
    stripped body, when those are the whole of them: vLLM's one-choice answer, the client
    having asked for none of the fields (the body is parsed once, for the tokens and the
    reply). None for either: read it from the body."""
    if cap.server != "vllm" or cap.null_keys != _ALL:
        return strip(data, cap), None, None
    fast = _strip_parsed(data)
    if fast is not None:
        return fast
    cut: list[tuple[bytes, int, int]] = []
    parsed: dict[int, Any] = {}
    sent = _null_members(data, _ALL, cut, parsed)
    keys = [key for key, _, _ in cut]
    if sorted(keys) not in (_ONE_CHOICE, _ONE_CHOICE_NO_PROMPT):
        return sent, None, None
    out = Tokens()
    try:
        for key, start, end in cut:
            if key == b"logprobs":
                lp = parsed.get(start)
                out.logprobs = _logprob_values(
                    lp if lp is not None else orjson.loads(memoryview(data)[start:end]))
            else:
                ids = _ints(orjson.loads(memoryview(data)[start:end]))
                if key == b"token_ids":
                    out.completion_token_ids = ids
                else:
                    out.prompt_token_ids = ids
    except orjson.JSONDecodeError:
        return sent, None, None
    return sent, out, None


# vLLM's chat logprobs as it writes them (compact JSON, members in this order), one entry a
# token: {"content":[{"token":..,"logprob":..,"bytes":[..],"top_logprobs":[]},..]}. Its
# choice's finish_reason follows.
_LOGPROBS = b'"logprobs":{"content":[{"token":'
_LOGPROB, _BYTES = b'"logprob":', b',"bytes":'
_LAST_ENTRY_END = b'],"top_logprobs":[]}]}'
_IDS = b',"token_ids":['
_PROMPT_IDS = b',"prompt_token_ids":['
_MEMBER_START = frozenset(b"{,")  # what a member follows in compact JSON
_NUMBER_BYTES = b"0123456789+-.eE,"  # what JSON numbers (and commas between) are written with


def _strip_parsed(data: bytes) -> tuple[bytes, Tokens, Any] | None:
    """`strip_body` of vLLM's usual chat answer (one choice, its members in vLLM's order,
    compact JSON) with no parse of its logprobs, which are most of its bytes and of what
    reading it costs. The three values are cut out by their bytes; the rest is parsed once
    (the reply and the client's answer); the ids are read from their own bytes, the logprob
    values from the bytes between each `"logprob":` and `,"bytes":`. None: another shape.

    Why the cuts are exact (the body being JSON): a key found after `,` or `{` is a member,
    never text, since inside a string every quote follows a backslash. Then:
    - the body left parses only when each cut is whole values: a cut that ends inside a
      value leaves its closing brackets unmatched;
    - the logprobs cut ends as vLLM's last entry ends (its bytes array, then its empty top
      logprobs and the closing brackets), with a `"logprob":`, `,"bytes":` pair for each
      completion token id and between them numbers only: a member of the choice after
      logprobs, or a next choice, would have to end the same way and bring entries of its
      own, leaving fewer than one per token in logprobs;
    - each of the three keys is left once in the body, as null where its parse says: the
      values cut were the choice's logprobs and token ids and the body's prompt ids."""
    start = data.find(_LOGPROBS)
    if start <= 0 or data[start - 1] not in _MEMBER_START:
        return None
    start += len(b'"logprobs":')
    end = data.find(_NEXT_MEMBER, start)
    ids_at = data.find(_IDS, end)
    prompt_at = data.rfind(_PROMPT_IDS)
    if end < 0 or ids_at < 0 or prompt_at < ids_at:
        return None
    ids_at += len(_IDS) - 1
    ids_end = data.find(b"]", ids_at) + 1
    prompt_at += len(_PROMPT_IDS) - 1
    prompt_end = data.find(b"]", prompt_at) + 1
    if prompt_end <= 0 or not ids_at < ids_end < prompt_at:
        return None
    # the logprobs, split at each "logprob": and ,"bytes": (one delimiter for both)
    pieces = data[start:end].replace(_BYTES, _LOGPROB).split(_LOGPROB)
    last = pieces[-1]
    if (not last.endswith(_LAST_ENTRY_END)
            or last.find(b"]") != len(last) - len(_LAST_ENTRY_END)):
        return None
    sent = b"null".join((data[:start], data[end:ids_at], data[ids_end:prompt_at],
                         data[prompt_end:]))
    ids_text, prompt_text = data[ids_at + 1:ids_end - 1], data[prompt_at + 1:prompt_end - 1]
    if not (ids_text.replace(b",", b"").isdigit() and prompt_text.replace(b",", b"").isdigit()):
        return None  # (what is not a list of integers, or an empty one: the long way)
    numbers = b"[%b]" % b",".join(pieces[1::2])
    if numbers.translate(None, _NUMBER_BYTES) != b"[]":
        return None  # (a logprob that is not a number: the long way, which skips it)
    try:
        obj = orjson.loads(sent)
        ids = orjson.loads(data[ids_at:ids_end])
        prompt = orjson.loads(data[prompt_at:prompt_end])
        values = orjson.loads(numbers)
    except orjson.JSONDecodeError:
        return None
    if type(obj) is not dict or len(pieces) != 2 * len(ids) + 1 or len(values) != len(ids):
        return None
    choices = obj.get("choices")
    if type(choices) is not list or len(choices) != 1 or type(choices[0]) is not dict:
        return None
    c0 = choices[0]
    if ("logprobs" not in c0 or c0["logprobs"] is not None or c0.get("token_ids", 0) is not None
            or obj.get("prompt_token_ids", 0) is not None
            or sent.count(b'"logprobs":') != 1 or sent.count(b'"token_ids":') != 1
            or sent.count(b'"prompt_token_ids":') != 1):
        return None
    return sent, Tokens(prompt, ids, values, numbers), obj


_ONE_CHOICE = sorted([b"logprobs", b"token_ids", b"prompt_token_ids"])
_ONE_CHOICE_NO_PROMPT = sorted([b"logprobs", b"token_ids"])


def strip_event(event: bytes, cap: Capture) -> bytes | None:
    """A stream event as the client would get it without capture; None: the server would not
    have sent it (vLLM sends a chunk with no text only to carry token ids or logprobs)."""
    out = strip(event, cap)
    # Compact JSON is told by its bytes (a delta's first member begins with a quote); spaced
    # JSON by the patterns.
    at = out.find(b'"delta":{')
    after = out[at + 9:at + 10] if at >= 0 else b""
    if (after == b"}" or (after != b'"' and _EMPTY_DELTA.search(out) is not None)) and (
            out.find(b'"finish_reason":null') >= 0 or _NULL_FINISH.search(out) is not None):
        data = event_data(out)
        try:
            obj = orjson.loads(data) if data is not None else None
        except orjson.JSONDecodeError:
            return out
        if isinstance(obj, dict) and not obj.get("usage"):
            choices = obj.get("choices")
            if isinstance(choices, list) and choices and all(
                    isinstance(c, dict) and c.get("delta") == {} and c.get("finish_reason") is None
                    for c in choices):
                return None
    return out


@dataclass(slots=True)
class Tokens:
    """What a turn's record keeps of a captured call (choice 0)."""

    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    # the logprobs as the server wrote them, a JSON array of numbers, when read from its bytes:
    # written as they are (writing floats costs several times what copying their text does)
    logprobs_json: bytes | None = field(default=None, compare=False, repr=False)

    @property
    def size(self) -> int:
        """About the bytes its fields take written as JSON."""
        a, b, c = self.prompt_token_ids, self.completion_token_ids, self.logprobs
        return 12 * ((len(a) if a else 0) + (len(b) if b else 0) + (len(c) if c else 0))

    def fields(self) -> dict[str, Any]:
        """The record's fields (for orjson: the logprobs may be an `orjson.Fragment`)."""
        raw = self.logprobs_json
        return {"prompt_token_ids": self.prompt_token_ids,
                "completion_token_ids": self.completion_token_ids,
                "logprobs": self.logprobs if raw is None else orjson.Fragment(raw)}


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, list) and set(map(type, value)) <= _INT:  # (one C pass)
        return value
    return None


_INT = frozenset({int})
_FLOAT = frozenset({float})


def _logprob_values(lp: Any) -> list[float] | None:
    """The sampled tokens' logprobs: chat's `content[].logprob` or completions' list."""
    if not isinstance(lp, dict):
        return None
    content = lp.get("content")
    if isinstance(content, list):
        try:  # the usual answer: every entry's logprob a float (read in C passes)
            values = [e["logprob"] for e in content]
        except (TypeError, KeyError, IndexError):
            values = None
        if values is not None and set(map(type, values)) <= _FLOAT:
            return values
        return [float(e["logprob"]) for e in content
                if isinstance(e, dict) and isinstance(e.get("logprob"), int | float)]
    values = lp.get("token_logprobs")
    if isinstance(values, list):
        return [float(v) if isinstance(v, int | float) else 0.0 for v in values]
    return None


def _read(obj: Any, out: Tokens) -> None:
    """Add one body's or chunk's tokens (choice 0) to `out`."""
    if not isinstance(obj, dict):
        return
    prompt = _ints(obj.get("prompt_token_ids"))
    choices = obj.get("choices")
    c0 = None
    if isinstance(choices, list):
        for c in choices:
            if isinstance(c, dict) and c.get("index", 0) == 0:
                c0 = c
                break
    if c0 is not None and prompt is None:
        prompt = _ints(c0.get("prompt_token_ids"))
    if prompt is not None and out.prompt_token_ids is None:
        out.prompt_token_ids = prompt
    if c0 is None:
        return
    ids = _ints(c0.get("token_ids"))
    if ids is not None:
        if out.completion_token_ids is None:
            out.completion_token_ids = []
        out.completion_token_ids.extend(ids)
    values = _logprob_values(c0.get("logprobs"))
    if values is not None:
        if out.logprobs is None:
            out.logprobs = []
        out.logprobs.extend(values)


def read_body(data: bytes) -> Tokens:
    try:
        return read_parsed(orjson.loads(data))
    except orjson.JSONDecodeError:
        return Tokens()


def read_parsed(obj: Any) -> Tokens:
    """`read_body` of a body already parsed."""
    out = Tokens()
    _read(obj, out)
    return out


def read_events(events: list[bytes]) -> Tokens:
    out = Tokens()
    for event in events:
        data = event_data(event)
        if data is None or data == b"[DONE]" or data.find(b"token_ids") < 0 and (
                data.find(b"logprob") < 0):
            continue
        try:
            _read(orjson.loads(data), out)
        except orjson.JSONDecodeError:
            continue
    return out
