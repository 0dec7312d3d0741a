"""Test support for live experiments: the config, one episode through the official client."""

from __future__ import annotations

from typing import Any

from conftest import Proxy

EXPERIMENT = {
    "name": "disclosure",
    "unit": "episode",
    "alpha": 0.05,
    "min_effect": 0.3,
    "arms": [
        {"name": "hidden", "disclosure": "hidden"},
        {"name": "told-wrong", "disclosure": "disclosed", "announced_budget": 3,
         "template": "[Budget] {total} turns in all."},
    ],
}


def experiment_config(**changes: Any) -> dict[str, Any]:
    """Proxy overrides with the experiment (changed as given) and a quick sweep."""
    return {"experiments": [{**EXPERIMENT, **changes}],
            "episodes": {"sweep_interval_s": 0.2}}


def run_episode(p: Proxy, eid: str, experiment: str = "disclosure",
                **headers: str) -> str:
    """Two turns through the official client; the arm the proxy answered with."""
    client = p.client()
    raw = client.chat.completions.with_raw_response.create(
        model="m1", messages=[{"role": "user", "content": "go"}],
        extra_headers={"X-Episode-Id": eid, "X-Episode-Experiment": experiment, **headers})
    assert raw.http_response.status_code == 200
    arm = raw.headers["x-episode-arm"]
    # the header is read on the first call only; a second call keeps the arm
    again = client.chat.completions.with_raw_response.create(
        model="m1", messages=[{"role": "user", "content": "go"},
                              {"role": "assistant", "content": "ok"},
                              {"role": "user", "content": "on"}],
        extra_headers={"X-Episode-Id": eid})
    assert again.headers["x-episode-arm"] == arm
    return arm


def report(p: Proxy, eid: str, success: bool) -> None:
    r = p.http().post(f"/v1/episodes/{eid}/outcome", json={"success": success})
    assert r.status_code == 200, r.text
