"""Field bounds: task, group, tags and metadata have documented limits, and past them a
clear 400 naming the field, from the episode API and from first-call headers alike."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Proxy, assert_openai_error, chat_body, new_id

from budgetproxy.core.spec import (
    GROUP_MAX_CHARS,
    METADATA_MAX_BYTES,
    TAGS_MAX_BYTES,
    TASK_ID_MAX_CHARS,
)


@pytest.mark.parametrize(("header", "param", "most"), [
    ("X-Episode-Task", "task_id", TASK_ID_MAX_CHARS),
    ("X-Episode-Group", "group", GROUP_MAX_CHARS),
])
def test_a_first_call_header_past_its_bound_is_a_400(default_proxy: Proxy, header: str,
                                                    param: str, most: int) -> None:
    http = default_proxy.http()
    eid = new_id("hb")
    r = http.post("/v1/chat/completions", json=chat_body(),
                  headers={"X-Episode-Id": eid, header: "t" * (most + 1)})
    assert_openai_error(r, 400, "invalid_request", param)
    assert http.get(f"/v1/episodes/{eid}").status_code == 404  # nothing was created
    r = http.post("/v1/chat/completions", json=chat_body(),
                  headers={"X-Episode-Id": eid, header: "t" * most})
    assert r.status_code == 200, r.text
    assert http.get(f"/v1/episodes/{eid}").json()[param] == "t" * most


@pytest.mark.parametrize(("body", "param"), [
    ({"task_id": "t" * (TASK_ID_MAX_CHARS + 1)}, "task_id"),
    ({"group": "g" * (GROUP_MAX_CHARS + 1)}, "group"),
    ({"tags": {"k": "v" * TAGS_MAX_BYTES}}, "tags"),
])
def test_an_episode_field_past_its_bound_is_a_400(default_proxy: Proxy, body: dict[str, Any],
                                                 param: str) -> None:
    r = default_proxy.http().post("/v1/episodes", json=body)
    err = assert_openai_error(r, 400, "invalid_request", param)
    assert "at most" in err["message"]


def test_fields_at_their_bounds_are_kept(default_proxy: Proxy) -> None:
    tags = {"k": "v" * (TAGS_MAX_BYTES - 16)}
    r = default_proxy.http().post("/v1/episodes", json={
        "task_id": "t" * TASK_ID_MAX_CHARS, "group": "g" * GROUP_MAX_CHARS, "tags": tags})
    assert r.status_code == 201, r.text
    eid = r.json()["episode_id"]
    meta = {"m": "x" * (METADATA_MAX_BYTES - 16)}
    r = default_proxy.http().post(f"/v1/episodes/{eid}/outcome",
                                  json={"success": True, "metadata": meta})
    assert r.status_code == 200, r.text


def test_outcome_metadata_past_its_bound_is_a_400(default_proxy: Proxy) -> None:
    eid = default_proxy.http().post("/v1/episodes", json={}).json()["episode_id"]
    r = default_proxy.http().post(f"/v1/episodes/{eid}/outcome", json={
        "success": True, "metadata": {"m": "x" * METADATA_MAX_BYTES}})
    assert_openai_error(r, 400, "invalid_request", "metadata")
    assert default_proxy.episode(eid)["status"] == "active"
