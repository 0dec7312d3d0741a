"""The probe marker: a probe's model call names no episode, is forwarded, spends no turn, and
is logged as a probe record; a marked call that names an episode is refused, so the marker
never lets an agent call past its budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ProxyFactory, assert_openai_error, chat_body, new_id

from budgetproxy.cli import main


def test_probe_call_spends_no_turn_and_leaves_a_probe_record(proxy: ProxyFactory) -> None:
    p = proxy({})
    eid = new_id("probe-src")
    client = p.client()
    client.chat.completions.create(model="m1", messages=[{"role": "user", "content": "t1"}],
                                   extra_headers={"X-Episode-Id": eid, "X-Episode-Budget": "3"})
    before = p.episode(eid)
    run = new_id("run")
    for _ in range(2):
        reply = client.chat.completions.with_raw_response.create(
            model="m1", messages=[{"role": "user", "content": "state"}],
            extra_headers={"X-Budgetproxy-Probe": run})
        assert reply.http_response.status_code == 200
        assert "x-episode-turn" not in reply.http_response.headers
    # Naming an episode too, in a header or the path, is refused before anything is spent.
    http = p.http()
    body = chat_body("x")
    for path, headers in (("/v1/chat/completions", {"X-Episode-Id": eid}),
                          (f"/episodes/{eid}/v1/chat/completions", {})):
        resp = http.post(path, json=body, headers={"X-Budgetproxy-Probe": run, **headers})
        assert_openai_error(resp, 400, "invalid_request", "X-Budgetproxy-Probe")
    after = p.episode(eid)
    assert after["turns_used"] == before["turns_used"] == 1
    assert after["remaining"] == before["remaining"] == 2
    probes = p.wait_records(2, type="probe", probe_id=run)
    assert len(probes) == 2
    assert all(r["request_messages"] == [{"role": "user", "content": "state"}] for r in probes)
    assert all(r["response"]["content"] == "echo: state" for r in probes)
    assert all("episode_id" not in r for r in probes)
    assert len(p.records(type="turn", episode_id=eid)) == 1


def test_require_id_refuses_probe_calls_like_any_call_without_an_episode(
    proxy: ProxyFactory,
) -> None:
    p = proxy({"episodes": {"require_id": True}})
    resp = p.http().post("/v1/chat/completions", json=chat_body("x"),
                         headers={"X-Budgetproxy-Probe": new_id("run")})
    assert_openai_error(resp, 400, "episode_id_required", "episode_id")


def test_the_probe_says_so_when_its_proxy_refuses_every_call(
    proxy: ProxyFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """Against a proxy with require_id, `budgetproxy probe` exits 2 naming the refusal."""
    p = proxy({"episodes": {"require_id": True}})
    eid = new_id("logged")
    p.client().chat.completions.create(model="m1", messages=[{"role": "user", "content": "a"}],
                                       extra_headers={"X-Episode-Id": eid,
                                                      "X-Episode-Task": "t"})
    p.http().post(f"/v1/episodes/{eid}/outcome", json={"success": True})
    p.wait_records(1, type="episode", episode_id=eid)
    logs = tmp_path / "logs.jsonl"
    logs.write_text("".join(json.dumps(r) + "\n" for r in p.records(episode_id=eid)))
    code = main(["probe", str(logs), "--proxy", p.url, "--a", "model=m1", "--b",
                 "task_id=t", "--scorer", "probe_scorers:prefers_a", "--states", "2",
                 "--samples", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "every probe call failed" in err and "episode_id_required" in err
