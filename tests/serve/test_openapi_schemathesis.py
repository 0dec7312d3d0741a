"""The OpenAPI description tells the truth: schemathesis generates requests (valid and not)
for every documented operation, sends them to the real server, and checks each answer's
status, content type and body against the description. Any mismatch or 5xx fails."""

from __future__ import annotations

import re
from typing import Any

import pytest
import schemathesis
from conftest import Proxy, ProxyFactory, chat_body, new_id
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from schemathesis.specs.openapi.checks import positive_data_acceptance
from schemathesis.specs.openapi.definitions import OPENAPI_31

from budgetproxy.core.paths import PathRefused, canonical_path
from budgetproxy.serve.episode_bodies import EPISODE_ID_PATTERN
from budgetproxy.serve.openapi import SEGMENT_PATTERN

KEY = {"Authorization": "Bearer schema-key"}


@pytest.fixture(scope="module")
def described(proxy: ProxyFactory) -> tuple[Proxy, Any]:
    p: Proxy = proxy({"auth": {"keys": ["schema-key"]}})
    return p, schemathesis.openapi.from_url(f"{p.url}/openapi.json")


@pytest.mark.parametrize("mode", list(schemathesis.GenerationMode))
def test_every_answer_matches_the_description(described: tuple[Proxy, Any],
                                              mode: schemathesis.GenerationMode) -> None:
    p, schema = described
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 9
    failures: list[str] = []
    for op in operations:
        if mode is schemathesis.GenerationMode.NEGATIVE and op.path == "/v1/models":
            continue  # it takes no input: there is nothing to make invalid
        for headers in (KEY, {}):  # with the key, and without (401 is documented too)
            try:
                _fuzz(op, mode, p.url, headers)
            except Exception as e:  # every operation is tried; all failures are reported
                failures.append(f"{op.method.upper()} {op.path} ({mode.value}, "
                                f"{'key' if headers else 'no key'}): {e}")
    assert not failures, "\n\n".join(failures)


def _fuzz(op: Any, mode: schemathesis.GenerationMode, url: str, headers: dict[str, str]
          ) -> None:
    @given(case=op.as_strategy(generation_mode=mode))
    @settings(max_examples=15, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case: Any) -> None:  # (a schemathesis.Case)
        # A rule the schema cannot state (budget within 1..max_turns, in the description):
        # such a request is refused with a documented 400, which is all that is checked.
        body = case.body if isinstance(case.body, dict) else {}
        b, m = body.get("budget"), body.get("max_turns")
        cross_field = isinstance(b, int | float) and isinstance(m, int | float) and b > m
        # nor that `experiment` names one in the config (none is here): a documented 400
        cross_field = cross_field or body.get("experiment") is not None
        if isinstance(case.query, dict) and "wait" in case.query and _a_long_wait(
                case.query.get("timeout_s", 30)):
            # A long poll on a group nobody fills waits its timeout_s out (30 s unless set,
            # up to 600): a short one, still within the schema, answers the same way sooner.
            case.query["timeout_s"] = 0.2
        case.call_and_validate(
            base_url=url, headers=headers,
            excluded_checks=[positive_data_acceptance] if cross_field else None)

    run()


def test_real_groups_and_trajectories_answer_as_described(
        described: tuple[Proxy, Any]) -> None:
    """Random names only find no group and no episode: these answers, to a group and an
    episode that exist, are checked against the description too (status and body)."""
    p, schema = described
    task, eid = new_id("task"), new_id()
    declare, read = schema["/v1/groups"]["POST"], schema["/v1/groups/{task_id}/{group}"]["GET"]
    trajectory = schema["/v1/episodes/{episode_id}/trajectory"]["GET"]

    def answer(op: Any, status: int, **parts: Any) -> dict[str, Any]:
        r = op.Case(headers=KEY, **parts).call_and_validate(base_url=p.url)
        assert r.status_code == status, r.text
        body: dict[str, Any] = r.json()
        return body

    assert answer(declare, 201, body={"task_id": task, "group": "g", "size": 1})["size"] == 1
    answer(declare, 200, body={"task_id": task, "group": "g", "size": 1})
    answer(declare, 409, body={"task_id": task, "group": "g", "size": 2})
    r = p.http().post("/v1/chat/completions", json=chat_body(), headers={
        **KEY, "X-Episode-Id": eid, "X-Episode-Task": task, "X-Episode-Group": "g"})
    assert r.status_code == 200, r.text
    group = {"task_id": task, "group": "g"}
    assert answer(read, 200, path_parameters=group)["done"] is False
    answer(trajectory, 409, path_parameters={"episode_id": eid})
    r = p.http().post(f"/v1/episodes/{eid}/outcome", json={"success": True}, headers=KEY)
    assert r.status_code == 200, r.text
    view = answer(read, 200, path_parameters=group, query={"wait": True, "timeout_s": 5})
    assert view["done"] is True and view["episodes"][0]["advantage"] == 0.0
    turns = answer(trajectory, 200, path_parameters={"episode_id": eid})["turns"]
    assert len(turns) == 1


def _a_long_wait(timeout_s: Any) -> bool:
    if isinstance(timeout_s, bool):
        return False
    try:
        return 0.2 < float(timeout_s) <= 600
    except (TypeError, ValueError):
        return False


def test_every_operation_documents_its_errors(default_proxy: Proxy) -> None:
    spec = default_proxy.http().get("/openapi.json").json()
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            codes = set(op["responses"])
            assert "422" not in codes, (method, path)  # validation errors are 400s here
            assert "401" in codes, (method, path)
            for code, answer in op["responses"].items():
                if code.startswith(("4", "5")):
                    ref = answer["content"]["application/json"]["schema"]["$ref"]
                    assert ref == "#/components/schemas/Error"
    get_episode = spec["paths"]["/v1/episodes/{episode_id}"]["get"]
    assert {"400", "404", "503"} <= set(get_episode["responses"])
    (param,) = get_episode["parameters"]
    assert param["schema"]["pattern"] == EPISODE_ID_PATTERN


def _schemas(node: Any) -> list[dict[str, Any]]:
    """Every JSON Schema the document holds (components, parameters, bodies, answers)."""
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "schema" and isinstance(value, dict):
                found.append(value)
            elif key == "schemas" and isinstance(value, dict):
                found.extend(v for v in value.values() if isinstance(v, dict))
            else:
                found.extend(_schemas(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_schemas(value))
    return found


def test_the_description_is_valid_openapi_3(default_proxy: Proxy) -> None:
    spec = default_proxy.http().get("/openapi.json").json()
    assert spec["openapi"].startswith("3.1.")
    errors = [e.message for e in Draft202012Validator(OPENAPI_31).iter_errors(spec)]
    assert not errors, errors
    schemas = _schemas(spec)
    assert len(schemas) > 20
    for schema in schemas:  # OpenAPI 3.1's schemas are JSON Schema 2020-12
        Draft202012Validator.check_schema(schema)
    assert {"/v1/groups", "/v1/groups/{task_id}/{group}",
            "/v1/episodes/{episode_id}/trajectory"} <= set(spec["paths"])


@given(segment=st.text(st.characters(max_codepoint=0x24FF), min_size=1, max_size=12)
       | st.sampled_from([".", "..", "...", ".a", "a;b", "a%b", " ", "~"]))
@settings(max_examples=300, database=None)
def test_a_group_segment_matches_the_pattern_when_the_path_routes_it(segment: str) -> None:
    """The task id and group pattern says what a path segment can carry: the segment is
    kept as sent (encoded, then decoded back) exactly when it matches."""
    raw = "/v1/groups/" + "".join(c if c.isalnum() else f"%{b:02X}"
                                  for c in segment for b in c.encode())
    try:
        routed = canonical_path(raw) == "/v1/groups/" + segment
    except PathRefused:
        routed = False
    assert routed == (re.fullmatch(SEGMENT_PATTERN.strip("^$"), segment) is not None)
