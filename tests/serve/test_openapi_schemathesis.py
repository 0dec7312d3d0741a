"""The OpenAPI description tells the truth: schemathesis generates requests (valid and not)
for every documented operation, sends them to the real server, and checks each answer's
status, content type and body against the description. Any mismatch or 5xx fails."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from conftest import Proxy, ProxyFactory
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from budgetproxy.serve.episode_bodies import EPISODE_ID_PATTERN

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
    assert len(operations) == 5
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
    def run(case: schemathesis.Case) -> None:
        # A rule the schema cannot state (budget within 1..max_turns, in the description):
        # such a request is refused with a documented 400, which is all that is checked.
        body = case.body if isinstance(case.body, dict) else {}
        b, m = body.get("budget"), body.get("max_turns")
        cross_field = isinstance(b, int | float) and isinstance(m, int | float) and b > m
        case.call_and_validate(
            base_url=url, headers=headers,
            excluded_checks=[positive_data_acceptance] if cross_field else None)

    run()


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
