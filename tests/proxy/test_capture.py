"""Token capture (upstreams[].capture_tokens): ids and logprobs logged, the client's bytes as
without capture, against a fake that answers with vLLM's and SGLang's fields."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
from conftest import Proxy, ProxyFactory, WatchedUpstream, new_id
from hypothesis import example, given, settings
from hypothesis import strategies as st

from budgetproxy.testing import fake_tokens

_VOLATILE = re.compile(rb'("id":"[a-z]+-fake-)\d+|("created":)\d+')


def _normal(data: bytes) -> bytes:
    """The bytes with the fake's per-answer id and timestamp fixed (they differ per call)."""
    return _VOLATILE.sub(lambda m: (m.group(1) or m.group(2)) + b"0", data)


def _proxies(proxy: ProxyFactory, upstream: WatchedUpstream, server: str) -> tuple[Proxy, Proxy]:
    base = {"name": "main", "base_url": upstream.base_url}
    on = proxy({"upstreams": [{**base, "capture_tokens": True, "token_server": server}]})
    off = proxy({"upstreams": [base]})
    return on, off


def _post(p: Proxy, path: str, body: dict[str, Any], server: str, eid: str) -> httpx.Response:
    r = p.http().post(path, json=body, headers={"X-Episode-Id": eid,
                                                "X-Fake-Token-Server": server})
    assert r.status_code == 200, r.text
    return r


def _turn(p: Proxy, eid: str) -> dict[str, Any]:
    (rec,) = p.wait_records(1, episode_id=eid, type="turn")
    return rec


CHAT = {"model": "m1", "messages": [{"role": "system", "content": "be brief"},
                                    {"role": "user", "content": "say three words please"}]}


@pytest.mark.parametrize("server", ["vllm", "sglang"])
@pytest.mark.parametrize("stream", [False, True])
def test_chat_bytes_unchanged_and_tokens_logged(
    proxy: ProxyFactory, upstream: WatchedUpstream, server: str, stream: bool
) -> None:
    on, off = _proxies(proxy, upstream, server)
    body = {**CHAT, "stream": stream}
    e_on, e_off = new_id(), new_id()
    got_on = _post(on, "/v1/chat/completions", body, server, e_on)
    got_off = _post(off, "/v1/chat/completions", body, server, e_off)
    assert _normal(got_on.content) == _normal(got_off.content)
    assert b"token_ids\":[" not in got_on.content and b"\"content\":[{\"token\"" not in (
        got_on.content)
    sent = [r.json for r in upstream.requests if r.headers.get("x-episode-id") is None
            and r.json and r.json.get("messages") == CHAT["messages"]][-2:]
    assert sent[0]["logprobs"] is True
    if server == "sglang" and stream:  # SGLang answers 400 to either field on a chat stream
        assert "return_token_ids" not in sent[0] and "return_prompt_token_ids" not in sent[0]
    else:
        assert sent[0]["return_token_ids"] is True
        assert sent[0].get("return_prompt_token_ids") is (True if server == "sglang" else None)
    assert "return_token_ids" not in sent[1] and "logprobs" not in sent[1]

    rec = _turn(on, e_on)
    answer = "echo: say three words please"
    want = fake_tokens.completion_ids(answer)
    if server == "sglang" and stream:  # SGLang's chat streams carry logprobs, no token ids
        assert rec["prompt_token_ids"] is None and rec["completion_token_ids"] is None
    else:
        assert rec["prompt_token_ids"] == fake_tokens.prompt_ids(CHAT["messages"])
        assert rec["completion_token_ids"] == want
    assert rec["logprobs"] == [fake_tokens.logprob(t) for t in want]
    assert "prompt_token_ids" not in _turn(off, e_off)


@pytest.mark.parametrize("stream", [False, True])
def test_client_asking_for_logprobs_keeps_them(
    proxy: ProxyFactory, upstream: WatchedUpstream, stream: bool
) -> None:
    on, off = _proxies(proxy, upstream, "vllm")
    body = {**CHAT, "stream": stream, "logprobs": True, "top_logprobs": 1}
    got_on = _post(on, "/v1/chat/completions", body, "vllm", new_id())
    got_off = _post(off, "/v1/chat/completions", body, "vllm", new_id())
    assert _normal(got_on.content) == _normal(got_off.content)
    assert b'"top_logprobs":[{"token"' in got_on.content


@pytest.mark.parametrize("server", ["vllm", "sglang"])
@pytest.mark.parametrize("stream", [False, True])
def test_completions_bytes_unchanged_and_tokens_logged(
    proxy: ProxyFactory, upstream: WatchedUpstream, stream: bool, server: str
) -> None:
    on, off = _proxies(proxy, upstream, server)
    body = {"model": "m1", "prompt": "once upon a time", "stream": stream}
    e_on = new_id()
    got_on = _post(on, "/v1/completions", body, server, e_on)
    got_off = _post(off, "/v1/completions", body, server, new_id())
    assert _normal(got_on.content) == _normal(got_off.content)
    rec = _turn(on, e_on)
    want = fake_tokens.completion_ids("echo: once upon a time")
    assert rec["prompt_token_ids"] == [fake_tokens.BOS, *fake_tokens.ids("once upon a time")]
    assert rec["completion_token_ids"] == want
    assert rec["logprobs"] == [fake_tokens.logprob(t) for t in want]


def test_openai_client_sees_the_same_answer(
    proxy: ProxyFactory, upstream: WatchedUpstream
) -> None:
    on, _ = _proxies(proxy, upstream, "vllm")
    client = on.client(default_headers={"X-Fake-Token-Server": "vllm"})
    eid = new_id()
    out = client.chat.completions.create(model="m1", messages=CHAT["messages"],  # type: ignore[arg-type]
                                         extra_headers={"X-Episode-Id": eid})
    assert out.choices[0].message.content == "echo: say three words please"
    assert out.choices[0].logprobs is None
    chunks = list(client.chat.completions.create(
        model="m1", messages=CHAT["messages"], stream=True,  # type: ignore[arg-type]
        extra_headers={"X-Episode-Id": eid}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "echo: say three words please")
    assert all(c.choices[0].logprobs is None for c in chunks if c.choices)


def test_dropped_token_only_chunk() -> None:
    """vLLM sends a chunk with an empty delta only for token ids or logprobs asked for:
    one the client did not ask for is not passed on."""
    from budgetproxy.proxy.capture import Capture, strip_event

    cap = Capture("chat", "vllm", strip_ids=True, strip_logprobs=True)
    ev = (b'data: {"id":"x","choices":[{"index":0,"delta":{},"logprobs":{"content":[{"token":'
          b'"a","logprob":-0.1,"bytes":[97],"top_logprobs":[]}]},"finish_reason":null,'
          b'"token_ids":[5]}]}\n\n')
    assert strip_event(ev, cap) is None
    kept = ev.replace(b'"delta":{}', b'"delta":{"content":"a"}')
    out = strip_event(kept, cap)
    assert out is not None and orjson.loads(out[6:])["choices"][0] == {
        "index": 0, "delta": {"content": "a"}, "logprobs": None, "finish_reason": None,
        "token_ids": None}


@pytest.mark.parametrize("history", ["keep", "drop"])
def test_disclosed_history_keep_gives_append_only_tokens(
    proxy: ProxyFactory, upstream: WatchedUpstream, history: str
) -> None:
    """With history: keep every turn's prompt ids extend the previous prompt and completion;
    with drop, the earlier texts are gone from the next prompt, so they do not."""
    from budgetproxy.core.tokens import extends

    p = proxy({"upstreams": [{"name": "main", "base_url": upstream.base_url,
                              "capture_tokens": True}],
               "disclosure": {"mode": "disclosed", "history": history}})
    client = p.client(default_headers={"X-Fake-Token-Server": "vllm"})
    eid = new_id()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "start the task"}]
    for i in range(3):
        out = client.chat.completions.create(model="m1", messages=messages,  # type: ignore[arg-type]
                                             extra_headers={"X-Episode-Id": eid})
        messages.append({"role": "assistant", "content": out.choices[0].message.content})
        messages.append({"role": "user", "content": f"observation {i}"})
    recs = sorted(p.wait_records(3, episode_id=eid, type="turn"), key=lambda r: r["turn"])
    links = [extends(a["prompt_token_ids"], a["completion_token_ids"], b["prompt_token_ids"])
             for a, b in zip(recs, recs[1:], strict=False)]
    assert links == ([True, True] if history == "keep" else [False, False])


@pytest.mark.parametrize("stream", [False, True])
def test_field_names_inside_texts_are_left_alone(
    proxy: ProxyFactory, upstream: WatchedUpstream, stream: bool
) -> None:
    """A reply whose text spells the stripped fields' names keeps its text: inside a JSON
    string their quotes are escaped, so only real members are matched."""
    on, off = _proxies(proxy, upstream, "vllm")
    text = 'say "token_ids":[1,2] and "logprobs":{"content":[]} and "prompt_token_ids": ]'
    body = {"model": "m1", "messages": [{"role": "user", "content": text}], "stream": stream}
    got_on = _post(on, "/v1/chat/completions", body, "vllm", new_id())
    got_off = _post(off, "/v1/chat/completions", body, "vllm", new_id())
    assert _normal(got_on.content) == _normal(got_off.content)
    if stream:
        events = [orjson.loads(line[6:]) for line in got_on.content.split(b"\n\n")
                  if line.startswith(b"data: {")]
        said = "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                       if e["choices"])
    else:
        said = got_on.json()["choices"][0]["message"]["content"]
    assert said == "echo: " + text


def test_upstream_errors_pass_through_with_capture(
    proxy: ProxyFactory, upstream: WatchedUpstream
) -> None:
    on, off = _proxies(proxy, upstream, "vllm")
    got = []
    eid = new_id()
    for p in (on, off):
        r = p.http().post("/v1/chat/completions", json=CHAT,
                          headers={"X-Episode-Id": f"{eid}-{len(got)}", "X-Fake-Status": "400",
                                   "X-Fake-Token-Server": "vllm"})
        assert r.status_code == 400
        got.append(r.content)
    assert got[0] == got[1]
    rec = _turn(on, f"{eid}-0")
    assert rec["http_status"] == 400
    assert rec["prompt_token_ids"] is None and rec["completion_token_ids"] is None


def test_sglang_client_asking_for_token_ids_only(
    proxy: ProxyFactory, upstream: WatchedUpstream
) -> None:
    """SGLang's chat API asks for prompt ids apart: a client that asked for token ids keeps
    them and gets no prompt ids it did not ask for."""
    on, off = _proxies(proxy, upstream, "sglang")
    body = {**CHAT, "return_token_ids": True}
    e_on = new_id()
    got_on = _post(on, "/v1/chat/completions", body, "sglang", e_on)
    got_off = _post(off, "/v1/chat/completions", body, "sglang", new_id())
    assert _normal(got_on.content) == _normal(got_off.content)
    choice = got_on.json()["choices"][0]
    assert "token_ids" in choice and "prompt_token_ids" not in choice
    assert _turn(on, e_on)["prompt_token_ids"] == fake_tokens.prompt_ids(CHAT["messages"])


# Integers within 64 bits: orjson reads larger ones as floats (a logprobs object holds floats,
# and the values the proxy keeps from it are floats either way).
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=4),
    max_leaves=12)


@settings(max_examples=300)
@given(value=st.dictionaries(st.text(max_size=5), _JSON, max_size=4),
       space=st.sampled_from(["", " ", "\n ", "\t"]), ascii_only=st.booleans(),
       follower=st.sampled_from([b',"y":[]}', b',"finish_reason":null}']))
def test_a_values_end_is_found_whatever_it_holds(value: dict[str, Any], space: str,
                                                  ascii_only: bool, follower: bytes) -> None:
    """The end of a logprobs-like object inside a body, as the standard library's decoder
    reads it: strings with brackets, quotes, escapes and non-ASCII text, nesting, spaces."""
    import json

    from budgetproxy.proxy.capture import _value_end

    inner = json.dumps(value, ensure_ascii=ascii_only).encode()
    buf = b'{"x":1,"logprobs":' + space.encode() + inner + space.encode() + follower
    start = buf.index(b'"logprobs":') + len(b'"logprobs":') + len(space)
    parsed: dict[int, Any] = {}
    assert _value_end(buf, start, parsed) == start + len(inner)
    assert parsed.get(start, value) == json.loads(inner)  # what was read on the way, if any


def _vllm_bodies() -> list[tuple[str, bytes]]:
    """vLLM-shaped chat and text completion answers, asked for ids and logprobs by the proxy."""
    chat_req = {**CHAT, "return_token_ids": True, "logprobs": True}
    base_choice = {"index": 0, "logprobs": None, "finish_reason": "stop"}
    usage = {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}
    out = []
    for text in ("ok", "a longer answer, with \"quotes\" and ,\"finish_reason\": inside it"):
        # (vLLM's member order: index, message, logprobs, finish_reason, stop_reason, ...)
        message = {"role": "assistant", "content": text}
        chat = {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "message": message, "logprobs": None,
                             "finish_reason": "stop"}],
                "usage": usage}
        out.append(("chat", orjson.dumps(fake_tokens.chat_body(chat, chat_req, "vllm"))))
        comp_req = {"model": "m", "prompt": "say it", "return_token_ids": True, "logprobs": 0}
        comp = {"id": "t", "object": "text_completion", "created": 0, "model": "m",
                "choices": [{**base_choice, "text": text}], "usage": usage}
        out.append(("completions",
                    orjson.dumps(fake_tokens.completion_body(comp, comp_req, "vllm"))))
    return out


@pytest.mark.parametrize(("kind", "body"), _vllm_bodies())
def test_a_body_stripped_and_read_in_one_pass_equals_the_two(kind: str, body: bytes) -> None:
    """strip_body: the client's bytes as strip() makes them, the tokens as read_body() reads
    them from the whole answer (each value read once, on the way)."""
    from budgetproxy.proxy import capture

    cap, _ = capture.plan({}, kind, "vllm")
    sent, tokens, answer = capture.strip_body(body, cap)
    assert sent == capture.strip(body, cap)
    assert tokens is not None
    assert tokens == capture.read_body(body)
    assert tokens.completion_token_ids and tokens.logprobs
    if kind == "chat":  # read by one parse, which is then the client's body's
        assert answer == orjson.loads(sent)
    else:  # completions keep prompt ids in the choice: read the long way
        assert answer is None


def _chat_body() -> bytes:
    return next(body for kind, body in _vllm_bodies() if kind == "chat")


def _spaced(body: bytes) -> bytes:
    return json.dumps(orjson.loads(body)).encode()  # ", " and ": " between members


def _finish_reason_inside(body: bytes) -> bytes:
    obj = orjson.loads(body)
    obj["choices"][0]["logprobs"]["content"][0]["finish_reason"] = "stop"
    return orjson.dumps(obj)


def _logprobs_inside(body: bytes) -> bytes:
    obj = orjson.loads(body)
    obj["choices"][0]["logprobs"]["content"][0]["logprobs"] = None
    return orjson.dumps(obj)


def _mixed_spacing(body: bytes) -> bytes:
    # the choice's finish_reason key spaced from its colon (so not found as written), and one
    # written compactly inside logprobs, after an object: that one must not end logprobs
    obj = orjson.loads(body)
    obj["choices"][0]["logprobs"]["content"][0].update({"x": {}, "finish_reason": "length"})
    return orjson.dumps(obj).replace(b',"finish_reason":"stop"', b',"finish_reason" :"stop"')


def _key_in_key(body: bytes) -> bytes:
    # a key whose text ends with `"token_ids` (its quote escaped), where token ids are looked
    # for: not a member of that name
    obj = orjson.loads(body)
    c0 = obj["choices"][0]
    rest = {k: c0.pop(k) for k in list(c0)[list(c0).index("finish_reason") + 1:]}
    c0.update({'x"token_ids': 1, **rest})
    return orjson.dumps(obj)


def _reordered(body: bytes) -> bytes:
    obj = orjson.loads(body)
    c0 = obj["choices"][0]
    obj["choices"][0] = {"finish_reason": c0.pop("finish_reason"), **c0}
    return orjson.dumps(obj)


def _message_last(body: bytes) -> bytes:
    # an object between finish_reason and token_ids: it could hold a token_ids member
    obj = orjson.loads(body)
    c0 = obj["choices"][0]
    c0["message"] = c0.pop("message")
    c0["token_ids"] = c0.pop("token_ids")
    return orjson.dumps(obj)


def _float_id(body: bytes) -> bytes:
    obj = orjson.loads(body)
    obj["choices"][0]["token_ids"][0] = 1.5
    return orjson.dumps(obj)


def _member_after_logprobs(body: bytes) -> bytes:
    # a member between the choice's logprobs and its finish_reason: not cut with logprobs
    obj = orjson.loads(body)
    c0 = obj["choices"][0]
    rest = {k: c0.pop(k) for k in list(c0)[list(c0).index("finish_reason"):]}
    c0.update({"x": {"content": [1]}, **rest})
    return orjson.dumps(obj)


def _top_logprobs(body: bytes) -> bytes:
    obj = orjson.loads(body)
    entry = obj["choices"][0]["logprobs"]["content"][0]
    entry["top_logprobs"] = [{"token": "a", "logprob": -1.0, "bytes": [97]}]
    return orjson.dumps(obj)


def _ids_in_message(body: bytes) -> bytes:
    obj = orjson.loads(body)
    obj["choices"][0]["message"]["token_ids"] = [1, 2]
    return orjson.dumps(obj)


def _null_logprob(body: bytes) -> bytes:
    obj = orjson.loads(body)
    obj["choices"][0]["logprobs"]["content"][-1]["logprob"] = None
    return orjson.dumps(obj)


_DECLINED = [_spaced, _finish_reason_inside, _mixed_spacing, _reordered,
             _float_id, _member_after_logprobs, _top_logprobs, _ids_in_message, _null_logprob,
             _key_in_key]


@pytest.mark.parametrize("variant", [*_DECLINED, _message_last, _logprobs_inside])
def test_shapes_the_short_read_does_not_know_are_stripped_as_the_long_way_strips_them(
        variant: Callable[[bytes], bytes]) -> None:
    """Whitespace between members, a `finish_reason` key inside logprobs (also with the
    choice's own finish_reason spaced), logprobs not followed by finish_reason, a
    token id that is not an integer, a member between logprobs and finish_reason, top
    logprobs, token ids in the message, a logprob that is not a number, a key that ends with
    `"token_ids`: the short read declines (no answer parsed) and the body is stripped as
    strip() strips it. The message after token ids, and a `logprobs` key inside an entry,
    it reads as the long way does."""
    from budgetproxy.proxy import capture

    cap, _ = capture.plan({}, "chat", "vllm")
    body = variant(_chat_body())
    fast = capture._strip_parsed(body)
    assert (fast is None) is (variant in _DECLINED)
    sent, tokens, answer = capture.strip_body(body, cap)
    assert sent == capture.strip(body, cap)
    if fast is None:
        assert answer is None
    else:
        assert answer == orjson.loads(sent) and tokens == capture.read_body(body)
    if tokens is not None:
        assert tokens == capture.read_body(body)


_TOKEN_TEXT = st.text(alphabet=st.sampled_from(list('ab"\\:,{}[] \n\u00e9')), max_size=6)


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(_TOKEN_TEXT, min_size=1, max_size=6), content=_TOKEN_TEXT,
       extra=st.sampled_from([None, "choice", "entry", "message", "logprobs"]),
       key=st.sampled_from(["x", "logprobs", "token_ids", "finish_reason", 'y\\', 'z"']),
       value=st.sampled_from([1, None, [], {}, {"content": [1]}, [1, [2]], "\\\":"]))
def test_the_short_read_is_the_long_way_or_declines(
        texts: list[str], content: str, extra: str | None, key: str, value: Any) -> None:
    """vLLM-shaped answers whose token texts and message hold quotes, backslashes, brackets
    and `":`, with a member added in the choice (after logprobs), a logprobs entry, the
    message or logprobs: whatever the short read answers is what the long way makes."""
    from budgetproxy.proxy import capture

    entries = [{"token": t, "logprob": -0.5 * i, "bytes": list(t.encode()), "top_logprobs": []}
               for i, t in enumerate(texts)]
    c0: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": content},
                          "logprobs": {"content": entries}, "finish_reason": "stop",
                          "stop_reason": None, "token_ids": list(range(len(texts)))}
    if extra == "choice":
        c0 = {k: c0[k] for k in ("index", "message", "logprobs")} | {key: value} | {
            k: c0[k] for k in ("finish_reason", "stop_reason", "token_ids")}
    elif extra == "entry":
        entries[-1][key] = value
    elif extra == "message":
        c0["message"][key] = value
    elif extra == "logprobs":
        c0["logprobs"][key] = value
    body = orjson.dumps({"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                         "choices": [c0], "usage": {"prompt_tokens": 2},
                         "prompt_logprobs": None, "prompt_token_ids": [7, 8],
                         "kv_transfer_params": None})
    cap, _ = capture.plan({}, "chat", "vllm")
    fast = capture._strip_parsed(body)
    if fast is not None:
        sent, tokens, answer = fast
        assert sent == capture.strip(body, cap)
        assert answer == orjson.loads(sent)
        assert tokens == capture.read_body(body)
    if extra is None and '":' not in orjson.dumps(texts).decode():
        assert fast is not None  # the usual answer takes the short read


_SPACE = st.sampled_from([" ", "  ", "\n", "\t", "\r\n", "\n  "])
_WHERE = ("before_colon", "after_colon", "before_comma", "after_comma", "inside_brackets")


def _spaced_json(value: Any, spaces: list[str], where: frozenset[str]) -> str:
    """`value` as JSON with whitespace (taken from `spaces` in turn) at the places `where`
    names: before and after colons and commas, inside brackets and braces."""
    turn = iter(range(1 << 30))

    def ws(place: str) -> str:
        return spaces[next(turn) % len(spaces)] if place in where else ""

    def write(v: Any) -> str:
        if isinstance(v, dict):
            members = [f"{ws('after_comma') if i else ''}{orjson.dumps(k).decode()}"
                       f"{ws('before_colon')}:{ws('after_colon')}{write(x)}{ws('before_comma')}"
                       for i, (k, x) in enumerate(v.items())]
            return "{" + ws("inside_brackets") + ",".join(members) + ws("inside_brackets") + "}"
        if isinstance(v, list):
            items = [f"{ws('after_comma') if i else ''}{write(x)}{ws('before_comma')}"
                     for i, x in enumerate(v)]
            return "[" + ws("inside_brackets") + ",".join(items) + ws("inside_brackets") + "]"
        return orjson.dumps(v).decode()

    return write(value)


@settings(max_examples=300, deadline=None)
@example(texts=["a"], content="ok", spaces=[" "], where=frozenset({"before_colon"}))
@given(texts=st.lists(_TOKEN_TEXT, min_size=1, max_size=4), content=_TOKEN_TEXT,
       spaces=st.lists(_SPACE, min_size=1, max_size=5),
       where=st.sets(st.sampled_from(_WHERE), min_size=1).map(frozenset))
def test_json_whitespace_anywhere_is_stripped_and_read_as_compact_json_is(
        texts: list[str], content: str, spaces: list[str], where: frozenset[str]) -> None:
    """A vLLM-shaped answer written with JSON whitespace anywhere it may stand (`"logprob" :`,
    `": "`, `" ,"`, newlines and tabs inside brackets) gets the client the answer the compact
    one gets, with no token field it did not ask for, and the same tokens logged."""
    from budgetproxy.proxy import capture

    entries = [{"token": t, "logprob": -0.5 * i, "bytes": list(t.encode()), "top_logprobs": []}
               for i, t in enumerate(texts)]
    doc = {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
           "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                        "logprobs": {"content": entries}, "finish_reason": "stop",
                        "stop_reason": None, "token_ids": list(range(len(texts)))}],
           "usage": {"prompt_tokens": 2}, "prompt_logprobs": None,
           "prompt_token_ids": [7, 8]}
    compact = orjson.dumps(doc)
    spaced = _spaced_json(doc, spaces, where).encode()
    assert orjson.loads(spaced) == doc
    cap, _ = capture.plan({}, "chat", "vllm")
    sent_c, tokens_c, _ = capture.strip_body(compact, cap)
    sent, tokens, answer = capture.strip_body(spaced, cap)
    got = orjson.loads(sent)
    assert got == orjson.loads(sent_c)
    c0 = got["choices"][0]
    assert (c0["logprobs"], c0["token_ids"], got["prompt_token_ids"]) == (None, None, None)
    assert answer is None or answer == got
    # (None: the tokens are read from the whole body, as the proxy does then)
    assert (tokens or capture.read_body(spaced)) == (tokens_c or capture.read_body(compact))
    assert capture.strip(spaced, cap) == sent or orjson.loads(capture.strip(spaced, cap)) == got


@settings(max_examples=200, deadline=None)
@example(text="", spaces=[" "], where=frozenset({"before_colon"}))
@given(text=st.sampled_from(["", "a", 'b":{}']),
       spaces=st.lists(st.sampled_from([" ", "  ", "\t"]), min_size=1, max_size=5),
       where=st.sets(st.sampled_from(_WHERE), min_size=1).map(frozenset))
def test_json_whitespace_anywhere_in_a_stream_event_strips_it_as_compact_json(
        text: str, spaces: list[str], where: frozenset[str]) -> None:
    """A vLLM stream chunk written with JSON whitespace anywhere it may stand on its one
    `data:` line (spaces and tabs; a line break would end the line): one that only
    carries token ids and logprobs the client did not ask for is not passed on; one with
    text reaches the client with those fields null, as its compact form does."""
    from budgetproxy.proxy.capture import Capture, strip_event

    cap = Capture("chat", "vllm", strip_ids=True, strip_logprobs=True)
    chunk = {"id": "x", "choices": [{
        "index": 0, "delta": {"content": text} if text else {},
        "logprobs": {"content": [{"token": "a", "logprob": -0.1, "bytes": [97],
                                  "top_logprobs": []}]},
        "finish_reason": None, "token_ids": [5]}]}
    compact = strip_event(b"data: " + orjson.dumps(chunk) + b"\n\n", cap)
    spaced = strip_event(b"data: " + _spaced_json(chunk, spaces, where).encode() + b"\n\n",
                         cap)
    if not text:
        assert compact is None and spaced is None
        return
    assert compact is not None and spaced is not None
    assert orjson.loads(spaced[6:]) == orjson.loads(compact[6:])
    assert orjson.loads(spaced[6:])["choices"][0]["logprobs"] is None


def test_a_body_with_two_choices_is_read_whole() -> None:
    from budgetproxy.proxy import capture

    cap, _ = capture.plan({}, "chat", "vllm")
    kind, body = _vllm_bodies()[0]
    obj = orjson.loads(body)
    obj["choices"].append({**obj["choices"][0], "index": 1})
    two = orjson.dumps(obj)
    sent, tokens, answer = capture.strip_body(two, cap)
    assert sent == capture.strip(two, cap) and tokens is None and answer is None


def test_a_next_member_inside_logprobs_does_not_end_them() -> None:
    """`,"finish_reason":` as a key inside the object: the read up to it fails, and the end
    is found the long way."""
    from budgetproxy.proxy.capture import _value_end

    inner = b'{"content":[{"a":0,"finish_reason":1}],"x":{"y":0,"finish_reason":[]}}'
    buf = b'{"logprobs":' + inner + b',"finish_reason":"stop"}'
    start = len(b'{"logprobs":')
    parsed: dict[int, Any] = {}
    assert _value_end(buf, start, parsed) == start + len(inner)
    assert parsed == {}  # not read by the short way


def test_logprobs_read_from_their_bytes_are_written_as_the_list_is() -> None:
    """The short read keeps the logprobs' text for the record: written, it is the JSON of
    the values read, in the record's line and in the standard library's fallback."""
    from budgetproxy.proxy import capture
    from budgetproxy.trajectories.sink import record_line

    _, tokens, _ = capture.strip_body(_chat_body(), capture.plan({}, "chat", "vllm")[0])
    assert tokens is not None and tokens.logprobs_json is not None
    as_list = capture.Tokens(tokens.prompt_token_ids, tokens.completion_token_ids,
                             tokens.logprobs)
    assert orjson.loads(orjson.dumps(tokens.fields())) == as_list.fields()
    big = {"n": 2**70, **tokens.fields()}  # orjson refuses it: the fallback writes the line
    assert orjson.loads(record_line(big))["logprobs"] == tokens.logprobs


def test_a_token_budget_on_a_captured_call_reports_the_settled_rest(
    proxy: ProxyFactory, upstream: WatchedUpstream
) -> None:
    """The whole answer is read before its head (for what is left once it settles): the
    token ids are read from that one parse, and the client's bytes stay as without capture."""
    on, off = _proxies(proxy, upstream, "vllm")
    body = {**CHAT, "max_tokens": 40}
    e_on, e_off = new_id(), new_id()
    got_on = on.http().post("/v1/chat/completions", json=body, headers={
        "X-Episode-Id": e_on, "X-Fake-Token-Server": "vllm", "X-Episode-Token-Budget": "60"})
    got_off = off.http().post("/v1/chat/completions", json=body, headers={
        "X-Episode-Id": e_off, "X-Fake-Token-Server": "vllm", "X-Episode-Token-Budget": "60"})
    assert _normal(got_on.content) == _normal(got_off.content)
    for p, r, eid in ((on, got_on, e_on), (off, got_off, e_off)):
        used = p.episode(eid)["tokens_used"]
        assert 0 < used < 60 and r.headers["x-episode-tokens-remaining"] == str(60 - used)
    rec = _turn(on, e_on)
    assert rec["completion_token_ids"] == fake_tokens.completion_ids(
        "echo: say three words please")
