"""The proxy in front of a hostile raw-socket upstream, driven by the official clients: a late
second answer reaches no later call (another episode's), and an answer HTTP does not allow is a
clean 502 whose turn is refunded and recorded."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from conftest import Proxy, ProxyFactory, new_id

CONTENT = re.compile(rb'"content":"([^"]*)"')


def chat_answer(text: bytes) -> bytes:
    return json.dumps({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m1",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text.decode()}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }).encode()


def http_answer(body: bytes, status: bytes = b"200 OK") -> bytes:
    return (b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            % (status, len(body)) + body)


class HostileUpstream:
    """A raw-socket chat upstream on 127.0.0.1 (its own thread and loop). It answers each
    call with the last message's text after `pace` seconds; a text that starts with a
    behaviour's name gets that behaviour instead."""

    def __init__(self, pace: float = 0.1, stray_after: float = 0.15) -> None:
        self.pace = pace
        self.stray_after = stray_after
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self.connections = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HostileUpstream:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                m = re.search(rb"(?i)content-length: *(\d+)", head)
                body = await reader.readexactly(int(m.group(1)) if m else 0)
                text = json.loads(body)["messages"][-1]["content"].encode()
                await asyncio.sleep(self.pace)
                if text.startswith(b"status-999"):
                    writer.write(http_answer(b'{"odd":true}', b"999 Odd"))
                elif text.startswith(b"switch"):
                    writer.write(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\n"
                                 b"connection: upgrade\r\n\r\nbytes of another protocol")
                else:
                    answer = http_answer(chat_answer(text))
                    writer.write(answer)
                    if text.startswith(b"stray"):
                        self.loop.call_later(self.stray_after, self._again, writer, answer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass

    @staticmethod
    def _again(writer: asyncio.StreamWriter, answer: bytes) -> None:
        if not writer.is_closing():
            writer.write(answer)


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileUpstream]:
    with HostileUpstream() as up:
        yield up


@pytest.fixture(scope="module")
def hostile_proxy(proxy: ProxyFactory, hostile: HostileUpstream) -> Proxy:
    return proxy({"upstreams": [{"name": "hostile", "base_url": hostile.base_url}],
                  "metrics": {"enabled": True}})


def test_a_late_second_answer_reaches_no_other_episode(hostile_proxy: Proxy) -> None:
    """Every answer is followed 150 ms later by a copy of itself on the same connection;
    twelve episodes call one after another. Each gets its own answer, as does its record."""
    client = hostile_proxy.client()
    sent: dict[str, str] = {}
    for i in range(12):
        eid = new_id("stray")
        text = f"stray {eid} {i}"
        reply = client.chat.completions.create(
            model="m1", messages=[{"role": "user", "content": text}],
            extra_headers={"X-Episode-Id": eid})
        assert reply.choices[0].message.content == text
        sent[eid] = text
    for eid, text in sent.items():
        (rec,) = hostile_proxy.wait_records(1, type="turn", episode_id=eid)
        assert rec["response"]["content"] == text
    metrics = hostile_proxy.http().get("/metrics").text
    assert re.search(r'budgetproxy_upstream_errors_total\{class="desync",upstream="hostile"\}'
                     r" 1\.0", metrics), "the desync is counted once"


@pytest.mark.parametrize("what", ["status-999", "switch"])
def test_an_answer_http_does_not_allow_is_a_refunded_502(hostile_proxy: Proxy,
                                                         what: str) -> None:
    client = hostile_proxy.client()
    eid = new_id(what)
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(
            model="m1", messages=[{"role": "user", "content": what}],
            extra_headers={"X-Episode-Id": eid})
    assert err.value.status_code == 502
    body: Any = err.value.body
    assert body["code"] == "upstream_error" and "hostile" in body["message"]
    assert hostile_proxy.episode(eid)["turns_used"] == 0  # refunded
    (rec,) = hostile_proxy.wait_records(1, type="turn", episode_id=eid)
    assert rec["status"] == "upstream_error" and rec["http_status"] == 502
    # and the proxy keeps serving
    ok = client.chat.completions.create(model="m1", messages=[{"role": "user", "content": "hi"}],
                                        extra_headers={"X-Episode-Id": eid})
    assert ok.choices[0].message.content == "hi"


def test_an_answer_http_does_not_allow_on_messages_is_anthropic_shaped(
        hostile_proxy: Proxy) -> None:
    client = anthropic.Anthropic(base_url=hostile_proxy.url, api_key="k", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as err:
        client.messages.create(model="m1", max_tokens=8,
                               messages=[{"role": "user", "content": "status-999"}],
                               extra_headers={"X-Episode-Id": new_id("msg999")})
    assert err.value.status_code == 502
    body: Any = err.value.body
    assert body["type"] == "error" and body["error"]["type"] == "api_error"
