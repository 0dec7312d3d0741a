"""The proxy's spans in a real Phoenix: an episode sent through `budgetproxy serve` with
tracing and content capture on, exported over OTLP/HTTP, read back from Phoenix's REST API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from conftest import free_port, new_id
from phoenix_support import Phoenix, run_phoenix

from budgetproxy.testing import FakeUpstream

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]
PROJECT = "budgetproxy-test"


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    yield from run_phoenix(tmp_path_factory.mktemp("phoenix"))


def _serve(upstream: FakeUpstream, phoenix: Phoenix, tmp: Path) -> subprocess.Popen[bytes]:
    config = tmp / "proxy.yaml"
    config.write_text(
        f"upstreams: [{{name: main, base_url: '{upstream.base_url}'}}]\n"
        "tracing: {enabled: true, capture_content: true}\n"
        "disclosure: {mode: disclosed}\n"
        f"trajectories: {{dir: '{tmp / 'traj'}'}}\n")
    port = free_port()
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": phoenix.url,
           "OTEL_SERVICE_NAME": "budgetproxy",
           "OTEL_RESOURCE_ATTRIBUTES": f"openinference.project.name={PROJECT}",
           "OTEL_BSP_SCHEDULE_DELAY": "200"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "budgetproxy", "serve", "--config", str(config),
         "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{proc.url}/healthz").status_code == 200:  # type: ignore[attr-defined]
                return proc
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "proxy did not start"
        time.sleep(0.1)


def _messages(attrs: dict[str, Any], side: str) -> list[tuple[str, str]]:
    """(role, content) of Phoenix's `llm.input_messages` / `llm.output_messages` attributes."""
    out = []
    for i in range(50):
        role = attrs.get(f"llm.{side}_messages.{i}.message.role")
        if role is None:
            break
        out.append((role, attrs.get(f"llm.{side}_messages.{i}.message.content", "")))
    return out


def test_an_episode_reads_back_from_phoenix_as_llm_spans(
    upstream: FakeUpstream, phoenix: Phoenix, tmp_path: Path
) -> None:
    proc = _serve(upstream, phoenix, tmp_path)
    episode = new_id("phx")
    try:
        client = openai.OpenAI(base_url=f"{proc.url}/v1", api_key="k",  # type: ignore[attr-defined]
                               max_retries=0, default_headers={"X-Episode-Id": episode,
                                                               "X-Episode-Budget": "3"})
        history: list[Any] = [{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": "first question"}]
        reply = client.chat.completions.create(model="m1", messages=history)
        history += [{"role": "assistant", "content": reply.choices[0].message.content},
                    {"role": "user", "content": "second question"}]
        stream = client.chat.completions.create(model="m1", messages=history, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        spans = phoenix.wait_spans(PROJECT, 2)
    finally:
        proc.terminate()
        proc.wait(20)
    mine = sorted((s for s in spans if s["attributes"].get("session.id") == episode),
                  key=lambda s: s["attributes"]["budgetproxy.turn"])
    assert [s["name"] for s in mine] == ["chat m1", "chat m1"]
    question = {1: "first question", 2: "second question"}
    for turn, span in enumerate(mine, 1):
        attrs = span["attributes"]
        assert span["span_kind"] == "LLM" and span["status_code"] == "UNSET"
        # what Phoenix shows: OpenInference names, from the GenAI attributes the proxy sends
        assert attrs["llm.model_name"] == "m1" and attrs["llm.provider"] == "openai"
        assert attrs["llm.token_count.prompt"] == attrs["gen_ai.usage.input_tokens"] > 0
        assert attrs["llm.token_count.completion"] == attrs["gen_ai.usage.output_tokens"] > 0
        assert attrs["gen_ai.conversation.id"] == episode
        assert (attrs["budgetproxy.turn"], attrs["budgetproxy.budget"],
                attrs["budgetproxy.remaining"], attrs["budgetproxy.disclosure"]) == (
            turn, 3, 3 - turn, "disclosed")
        inputs = _messages(attrs, "input")
        [(role, text)] = _messages(attrs, "output")
        # the conversation as the agent sent it; the model's answer (the fake echoes what it
        # got) shows the disclosure text the proxy placed on it upstream
        assert inputs[0] == ("system", "Be brief.") and inputs[-1] == ("user", question[turn])
        assert role == "assistant" and text.startswith(f"echo: {question[turn]}")
        assert f"[Turn budget] Turn {turn} of 3." in text
        assert json.loads(attrs["gen_ai.input.messages"])[0]["role"] == "system"
    assert mine[1]["attributes"]["llm.input_messages.2.message.role"] == "assistant"
    assert len({s["context"]["trace_id"] for s in mine}) == 2
    assert any(s.get("session_id") == episode for s in phoenix.sessions(PROJECT))
