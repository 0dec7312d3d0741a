"""The probe marker: a probe's model call is forwarded, never spends a turn, and is logged
as a probe record, whatever episode id it names."""

from __future__ import annotations

from conftest import ProxyFactory, new_id


def test_probe_call_spends_no_turn_and_leaves_a_probe_record(proxy: ProxyFactory) -> None:
    p = proxy({"episodes": {"require_id": True}})
    eid = new_id("probe-src")
    client = p.client()
    client.chat.completions.create(model="m1", messages=[{"role": "user", "content": "t1"}],
                                   extra_headers={"X-Episode-Id": eid, "X-Episode-Budget": "3"})
    before = p.episode(eid)
    run = new_id("run")
    for headers in ({"X-Budgetproxy-Probe": run, "X-Episode-Id": eid},
                    {"X-Budgetproxy-Probe": run}):  # no id, and require_id set: still served
        reply = client.chat.completions.with_raw_response.create(
            model="m1", messages=[{"role": "user", "content": "state"}], extra_headers=headers)
        assert reply.http_response.status_code == 200
        assert "x-episode-turn" not in reply.http_response.headers
    # a probe on the episode's own path prefix is not its turn either
    on_path = p.client(base_url=f"{p.url}/episodes/{eid}/v1")
    on_path.chat.completions.create(model="m1", messages=[{"role": "user", "content": "x"}],
                                    extra_headers={"X-Budgetproxy-Probe": run})
    after = p.episode(eid)
    assert after["turns_used"] == before["turns_used"] == 1
    assert after["remaining"] == before["remaining"] == 2
    probes = p.wait_records(3, type="probe", probe_id=run)
    assert len(probes) == 3
    assert all(r["request_messages"][-1]["role"] == "user" for r in probes)
    assert all(r["response"]["content"].startswith("echo: ") for r in probes)
    assert all("episode_id" not in r for r in probes)
    assert len(p.records(type="turn", episode_id=eid)) == 1
