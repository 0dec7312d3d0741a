"""Tracing: GenAI-convention spans per model call, in memory and exported over OTLP/HTTP."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from budgetproxy.config import load_config
from budgetproxy.serve.server import ProxyServer
from budgetproxy.telemetry.tracing import Tracing
from budgetproxy.testing.fake_upstream import FakeUpstream


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    up = FakeUpstream(models=["fake-model"]).start()
    yield up
    up.stop()


@pytest.fixture()
def traced(
    upstream: FakeUpstream, tmp_path: Path
) -> Iterator[tuple[ProxyServer, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    cfg = load_config(None, {"upstreams": [{"base_url": upstream.base_url}],
                             "server": {"forward_headers": ["x-fake-*"]},
                             "trajectories": {"dir": str(tmp_path)}})
    srv = ProxyServer(cfg, span_processor=SimpleSpanProcessor(exporter)).start()
    yield srv, exporter
    srv.stop()


def _finished(exporter: InMemorySpanExporter, n: int) -> tuple[ReadableSpan, ...]:
    """The exporter's spans once there are `n`: a span ends just after its call's last byte,
    so a client can hold its answer before the proxy has handed the span over."""
    deadline = time.monotonic() + 5
    while len(exporter.get_finished_spans()) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    return tuple(exporter.get_finished_spans())


def test_one_genai_span_per_model_call(traced, upstream: FakeUpstream) -> None:
    srv, exporter = traced
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="k")
    client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "secret words"}],
        extra_headers={"X-Episode-Id": "trace-1", "X-Episode-Budget": "4",
                       "X-Episode-Max-Turns": "8"},
    )
    stream = client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "more secret words"}],
        stream=True, extra_headers={"X-Episode-Id": "trace-1", "X-Fake-Chunks": "8"},
    )
    assert len(list(stream)) >= 8
    spans = _finished(exporter, 2)
    assert [s.name for s in spans] == ["chat fake-model", "chat fake-model"]  # no per-chunk spans
    a = dict(spans[0].attributes or {})
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == "fake-model"
    assert a["gen_ai.provider.name"] == "openai"
    assert a["gen_ai.conversation.id"] == "trace-1"
    assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
    assert a["budgetproxy.budget"] == 4 and a["budgetproxy.turn"] == 1
    assert dict(spans[1].attributes or {})["budgetproxy.turn"] == 2
    flat = repr([dict(s.attributes or {}) for s in spans])
    assert "secret" not in flat  # no message content unless enabled
    # the upstream call carries the span's trace context
    tp = upstream.requests[-1].headers["traceparent"]
    assert tp.split("-")[1] == format(spans[1].context.trace_id, "032x")


def test_a_refunded_turns_span_says_what_its_log_record_says(traced, upstream: FakeUpstream,
                                                             tmp_path: Path) -> None:
    """An upstream 5xx gives the turn back: the span must not report it charged."""
    srv, exporter = traced
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hi"}],
            extra_headers={"X-Episode-Id": "refund-1", "X-Episode-Budget": "5",
                           "X-Fake-Status": "500"},
        )
    client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}],
                                   extra_headers={"X-Episode-Id": "refund-1"})
    failed, ok = (dict(s.attributes or {}) for s in _finished(exporter, 2))
    assert failed["error.type"] == "status_5xx"
    assert failed["budgetproxy.charged"] is False and failed["budgetproxy.remaining"] == 5
    assert ok["budgetproxy.charged"] is True and ok["budgetproxy.remaining"] == 4
    srv.stop()  # the log is flushed
    turns = [json.loads(line) for f in sorted(tmp_path.glob("*.jsonl"))
             for line in f.read_text().splitlines() if '"type":"turn"' in line]
    assert [(t["charged"], t["remaining"]) for t in turns] == [(False, 5), (True, 4)]


def test_spans_name_the_upstream_host_and_port(traced, upstream: FakeUpstream) -> None:
    srv, exporter = traced
    openai.OpenAI(base_url=srv.url + "/v1", api_key="k").chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}])
    (span,) = _finished(exporter, 1)
    attrs = dict(span.attributes or {})
    assert attrs["server.address"] == "127.0.0.1"
    assert attrs["server.port"] == int(upstream.base_url.rsplit(":", 1)[1].split("/")[0])


def test_telemetry_failure_never_fails_a_call(upstream: FakeUpstream, tmp_path: Path) -> None:
    class Broken(SimpleSpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            raise RuntimeError("exporter on fire")

    cfg = load_config(None, {"upstreams": [{"base_url": upstream.base_url}],
                             "server": {"forward_headers": ["x-fake-*"]},
                             "trajectories": {"dir": str(tmp_path)}})
    with ProxyServer(cfg, span_processor=Broken(InMemorySpanExporter())) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="k")
        out = client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hi"}])
        assert out.choices[0].message.content == "echo: hi"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _served(upstream: FakeUpstream, tmp_path: Path,
            **env: str) -> Iterator[tuple[subprocess.Popen[bytes], openai.OpenAI, int]]:
    """`budgetproxy serve` in its own process with these OTEL_* settings, once it answers."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "budgetproxy", "serve", "--upstream", upstream.base_url,
         "--port", str(port), "--log-dir", str(tmp_path)],
        env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "proxy did not start"
            time.sleep(0.1)
        yield proc, openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k",
                                  max_retries=0), port
    finally:
        if proc.poll() is None:
            proc.kill()


def _exported(port: int, at_least: int) -> tuple[float, str]:
    """Spans counted as exported on /metrics (once the collector has taken them), waiting up
    to 20 s for `at_least`; and the metrics text."""
    deadline = time.monotonic() + 20
    exported, text = 0.0, ""
    while exported < at_least and time.monotonic() < deadline:
        time.sleep(0.05)
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        exported = sum(float(line.split()[-1]) for line in text.splitlines()
                       if line.startswith('budgetproxy_trace_spans_total{result="exported"}'))
    return exported, text


def _received(upstream: FakeUpstream) -> list[tuple[str | None, Any]]:
    """(service.name, span) for every span the fake collector was sent."""
    spans = []
    for body in upstream.traces:
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        for rs in req.resource_spans:
            service = {a.key: a.value.string_value for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                spans.extend((service.get("service.name"), sp) for sp in ss.spans)
    return spans


def test_spans_export_over_otlp_http(upstream: FakeUpstream, tmp_path: Path) -> None:
    upstream.reset()  # the fake upstream is the collector too (POST /v1/traces)
    with _served(upstream, tmp_path,
                 OTEL_EXPORTER_OTLP_ENDPOINT=upstream.base_url.removesuffix("/v1"),
                 OTEL_SERVICE_NAME="budgetproxy-test",
                 OTEL_BSP_SCHEDULE_DELAY="100") as (proc, client, port):
        client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hi"}],
            extra_headers={"X-Episode-Id": "otlp-1"})
        exported, text = _exported(port, 1)
        assert exported == 1
        assert 'budgetproxy_trace_spans_total{result="dropped"} 0.0' in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    spans = _received(upstream)
    assert [(svc, s.name) for svc, s in spans] == [("budgetproxy-test", "chat fake-model")]
    attrs = {a.key: a.value for a in spans[0][1].attributes}
    assert attrs["gen_ai.conversation.id"].string_value == "otlp-1"


def test_a_busy_proxy_sends_full_batches_and_loses_none_at_shutdown(
        upstream: FakeUpstream, tmp_path: Path) -> None:
    """Full batches leave while the proxy serves; what is queued at SIGTERM leaves at
    shutdown. Every call's span arrives."""
    upstream.reset()
    with _served(upstream, tmp_path,
                 OTEL_EXPORTER_OTLP_ENDPOINT=upstream.base_url.removesuffix("/v1"),
                 OTEL_BSP_MAX_EXPORT_BATCH_SIZE="4",
                 OTEL_BSP_SCHEDULE_DELAY="60000") as (proc, client, port):
        for i in range(10):
            client.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": f"hi {i}"}],
                extra_headers={"X-Episode-Id": f"busy-{i}"})
        # two full batches, long before the 60 s schedule delay would send anything
        assert _exported(port, 8)[0] == 8
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    ids = [{a.key: a.value for a in sp.attributes}["gen_ai.conversation.id"].string_value
           for _, sp in _received(upstream)]
    assert sorted(ids) == sorted(f"busy-{i}" for i in range(10))
    assert len(upstream.traces) == 3  # 4 + 4 while serving, 2 at shutdown


def _proxy(upstream: FakeUpstream, tmp_path: Path, exporter: InMemorySpanExporter,
           **tracing: object) -> ProxyServer:
    cfg = load_config(None, {"upstreams": [{"base_url": upstream.base_url}],
                             "server": {"forward_headers": ["x-fake-*"]},
                             "trajectories": {"dir": str(tmp_path)}, "tracing": tracing})
    return ProxyServer(cfg, span_processor=SimpleSpanProcessor(exporter))


def _chat(srv: ProxyServer, headers: dict[str, str], content: str = "hi") -> None:
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="k", max_retries=0)
    client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": content}],
        extra_headers=headers)


def test_the_agents_trace_is_continued(upstream: FakeUpstream, tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    agent_trace, agent_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with _proxy(upstream, tmp_path, exporter) as srv:
        _chat(srv, {"X-Episode-Id": "parented", "traceparent": f"00-{agent_trace}-{agent_span}-01",
                    "tracestate": "vendor=abc"})
        sent = upstream.requests[-1].headers
    (span,) = exporter.get_finished_spans()
    assert format(span.context.trace_id, "032x") == agent_trace
    assert span.parent is not None and span.parent.is_remote
    assert format(span.parent.span_id, "016x") == agent_span
    # upstream sees the proxy's span as the parent, in the agent's trace, with its tracestate
    assert sent["traceparent"] == f"00-{agent_trace}-{span.context.span_id:016x}-01"
    assert sent["tracestate"] == "vendor=abc"


def test_an_unsampled_agent_trace_stays_unsampled(upstream: FakeUpstream,
                                                  tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    agent_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    with _proxy(upstream, tmp_path, exporter) as srv:
        _chat(srv, {"traceparent": f"00-{agent_trace}-00f067aa0ba902b7-00"})
        sent = upstream.requests[-1].headers["traceparent"]
    assert exporter.get_finished_spans() == ()
    version, trace_id, span_id, flags = sent.split("-")
    assert (version, trace_id, flags) == ("00", agent_trace, "00")
    assert span_id != "00f067aa0ba902b7"


@pytest.mark.parametrize("bad", ["garbage", "00-" + "0" * 32 + "-00f067aa0ba902b7-01",
                                 "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
                                 "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"])
def test_a_malformed_traceparent_starts_a_new_trace(upstream: FakeUpstream, tmp_path: Path,
                                                    bad: str) -> None:
    exporter = InMemorySpanExporter()
    with _proxy(upstream, tmp_path, exporter) as srv:
        _chat(srv, {"traceparent": bad})
        sent = upstream.requests[-1].headers["traceparent"]
    (span,) = exporter.get_finished_spans()
    assert span.parent is None
    assert sent == f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-01"


def test_sampler_from_the_environment(upstream: FakeUpstream, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    exporter = InMemorySpanExporter()
    with _proxy(upstream, tmp_path, exporter) as srv:
        for _ in range(200):
            _chat(srv, {})
    sampled = len(exporter.get_finished_spans())
    assert 20 <= sampled <= 80, sampled  # 50 expected; binomial sd ~6


def test_a_ratio_sampler_takes_whole_episodes_on_every_replica(
        upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With 10% of traces sampled, an operator should see 10% of episodes with every turn,
    not a tenth of each episode's turns; two replicas sharing episodes must agree."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
    exporter = InMemorySpanExporter()
    episodes, turns = 40, 3
    with (_proxy(upstream, tmp_path / "a", exporter) as a,
          _proxy(upstream, tmp_path / "b", exporter) as b):
        for turn in range(turns):
            for e in range(episodes):
                replica = (a, b)[(e + turn) % 2]
                _chat(replica, {"X-Episode-Id": f"whole-{e}"}, content=f"turn {turn}")
        for i in range(60):  # calls outside episodes are sampled one by one, as before
            _chat((a, b)[i % 2], {}, content=f"loose {i}")
    spans = exporter.get_finished_spans()
    per_episode: dict[str, int] = {}
    loose = 0
    for span in spans:
        eid = (span.attributes or {}).get("gen_ai.conversation.id")
        if eid is None:
            loose += 1
        else:
            per_episode[str(eid)] = per_episode.get(str(eid), 0) + 1
    assert set(per_episode.values()) == {turns}, per_episode  # all of an episode's turns
    assert 8 <= len(per_episode) <= 32, len(per_episode)  # 20 expected; binomial sd ~3
    assert 12 <= loose <= 48, loose  # 30 expected; sd ~4
    # every call still starts its own trace
    assert len({span.context.trace_id for span in spans}) == len(spans)


def test_content_only_when_enabled(upstream: FakeUpstream, tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    with _proxy(upstream, tmp_path, exporter, capture_content=True) as srv:
        _chat(srv, {"X-Episode-Id": "content-1"}, content="what is 2+2?")
    (span,) = exporter.get_finished_spans()
    attrs = dict(span.attributes or {})
    assert json.loads(attrs["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "what is 2+2?"}]}]
    (out,) = json.loads(attrs["gen_ai.output.messages"])
    assert out["role"] == "assistant" and out["finish_reason"] == "stop"
    assert out["parts"] == [{"type": "text", "content": "echo: what is 2+2?"}]


@pytest.mark.parametrize("sampler,arg", [
    ("parentbased_always_on", None), ("always_on", None), ("always_off", None),
    ("parentbased_always_off", None), ("traceidratio", "0.3"),
    ("parentbased_traceidratio", "0.7"), ("traceidratio", "not a number"),
    ("traceidratio", "1.5"), ("no_such_sampler", None),
])
def test_sampling_decisions_are_the_sdks(monkeypatch: pytest.MonkeyPatch, sampler: str,
                                         arg: str | None) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    if arg is None:
        monkeypatch.delenv("OTEL_TRACES_SAMPLER_ARG", raising=False)
    else:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", arg)
    tracing = Tracing(SimpleSpanProcessor(InMemorySpanExporter()))
    sdk = TracerProvider(shutdown_on_exit=False).sampler
    rng = random.Random(7)
    for i in range(300):
        parent = None
        headers: dict[bytes, bytes] = {}
        if i % 3:  # a third without a parent, a third with a sampled one, a third unsampled
            flags = i % 3 == 1
            tid = rng.getrandbits(128)
            headers[b"traceparent"] = f"00-{tid:032x}-{i + 1:016x}-0{int(flags)}".encode()
            parent = trace.set_span_in_context(NonRecordingSpan(SpanContext(
                tid, i + 1, is_remote=True, trace_flags=TraceFlags(int(flags)))))
        ct = tracing.start("chat", "m", headers, f"ep-{i % 17}" if i % 2 else None)
        assert ct is not None
        expected = sdk.should_sample(parent or Context(), ct.trace_id, "chat m").decision
        assert ct.sampled == expected.is_sampled(), (i, ct.trace_id)


def test_an_unreachable_collector_costs_no_call_and_no_stuck_shutdown(
        upstream: FakeUpstream, tmp_path: Path) -> None:
    dead = _free_port()  # nothing listens on it
    with _served(upstream, tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{dead}",
                 OTEL_BSP_SCHEDULE_DELAY="100") as (proc, client, _):
        for _ in range(20):
            t = time.monotonic()
            client.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "hi"}],
                extra_headers={"X-Episode-Id": "no-collector"})
            assert time.monotonic() - t < 3.0  # export retries (up to 5 s) never hold a call
            time.sleep(0.05)
        t = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert time.monotonic() - t < 10  # the export gives up after 5 s
    turns = [line for f in tmp_path.glob("*.jsonl") for line in f.read_text().splitlines()
             if '"type":"turn"' in line.replace(" ", "")]
    assert len(turns) == 20  # nothing lost
