"""Tracing: GenAI-convention spans per model call, in memory and exported over OTLP/HTTP."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from budgetproxy.config import load_config
from budgetproxy.server import ProxyServer
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
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    cfg = load_config(None, {"upstreams": [{"base_url": upstream.base_url}],
                             "trajectories": {"dir": str(tmp_path)}})
    srv = ProxyServer(cfg, tracer=provider.get_tracer("test")).start()
    yield srv, exporter
    srv.stop()


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
    # A stream's span ends once the proxy has settled the turn, just after the last byte.
    deadline = time.monotonic() + 5
    while len(exporter.get_finished_spans()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    spans = exporter.get_finished_spans()
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


def test_telemetry_failure_never_fails_a_call(upstream: FakeUpstream, tmp_path: Path) -> None:
    class Broken:
        def start_span(self, *a: object, **k: object) -> object:
            raise RuntimeError("exporter on fire")

    cfg = load_config(None, {"upstreams": [{"base_url": upstream.base_url}],
                             "trajectories": {"dir": str(tmp_path)}})
    with ProxyServer(cfg, tracer=Broken()) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="k")
        out = client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hi"}])
        assert out.choices[0].message.content == "echo: hi"


class _Receiver(http.server.BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        n = int(self.headers.get("content-length", "0"))
        _Receiver.bodies.append(self.rfile.read(n))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_spans_export_over_otlp_http(upstream: FakeUpstream, tmp_path: Path) -> None:
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    port = _free_port()
    env = {**os.environ,
           "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.server_address[1]}",
           "OTEL_SERVICE_NAME": "budgetproxy-test", "OTEL_BSP_SCHEDULE_DELAY": "100"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "budgetproxy", "serve", "--upstream", upstream.base_url,
         "--port", str(port), "--log-dir", str(tmp_path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k",
                               max_retries=0)
        while True:
            try:
                client.chat.completions.create(
                    model="fake-model", messages=[{"role": "user", "content": "hi"}],
                    extra_headers={"X-Episode-Id": "otlp-1"})
                break
            except openai.APIConnectionError:
                assert time.monotonic() < deadline, "proxy did not start"
                time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        receiver.shutdown()
    spans = []
    for body in _Receiver.bodies:
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        for rs in req.resource_spans:
            service = {a.key: a.value.string_value for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                spans.extend((service.get("service.name"), s) for s in ss.spans)
    assert [(svc, s.name) for svc, s in spans] == [("budgetproxy-test", "chat fake-model")]
    attrs = {a.key: a.value for a in spans[0][1].attributes}
    assert attrs["gen_ai.conversation.id"].string_value == "otlp-1"
