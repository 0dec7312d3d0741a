"""The config loader: YAML with ${ENV} expansion, overrides, and one-line errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from budgetproxy.config import Config, ConfigError, expand_env, load_config


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "config.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def test_no_file_gives_the_embedded_defaults() -> None:
    c = load_config(None)
    assert isinstance(c, Config)
    assert c.server.host == "127.0.0.1" and c.server.port == 8080
    assert c.server.max_body_bytes == 33554432
    assert c.budget.default_turns == 20 and c.budget.on_exhausted == "reject"
    assert c.budget.finish_reason == "length" and c.budget.free_retries_per_turn == 2
    assert c.budget.sampler == "none" and c.budget.budgetmix.step == 0.1
    assert c.disclosure.mode == "hidden" and c.disclosure.placement == "last_message"
    assert c.disclosure.history == "keep"
    assert c.episodes.id_headers == ["X-Episode-Id"] and c.episodes.budget_headers == "always"
    assert c.trajectories.dir == "./trajectories" and c.trajectories.content == "full"
    assert c.metrics.turn_buckets == 64
    assert c.store.kind == "memory" and c.store.on_unavailable == "fail_closed"
    assert c.auth.keys == []


def test_contract_example_loads(tmp_path: Path) -> None:
    text = """
server: {host: 127.0.0.1, port: 8080, max_body_bytes: 33554432}
upstreams:
  - {name: local, base_url: "http://127.0.0.1:8000/v1", api_key: "${UPSTREAM_KEY}",
     models: ["*"], timeout_s: 600, inject_stream_usage: true}
budget:
  default_turns: 20
  on_exhausted: reject
  finish_reason: length
  count_failed_turns: false
  free_retries_per_turn: 2
  sampler: none
  budgetmix: {max_turns: 20, step: 0.1}
  seed: 0
disclosure:
  mode: hidden
  disclosed_fraction: 0.5
  placement: last_message
  history: keep
  template: "[Turn budget] Turn {turn} of {total}. {remaining} turns remain after this one."
episodes:
  id_headers: [X-Episode-Id]
  require_id: false
  idle_timeout_s: 3600
  retention_s: 86400
  uncounted_models: []
  budget_headers: always
trajectories: {dir: ./trajectories, content: full}
metrics: {turn_buckets: 64}
store: {kind: memory, on_unavailable: fail_closed}
auth: {keys: []}
"""
    c = load_config(write(tmp_path, text), environ={"UPSTREAM_KEY": "sk-up"})
    assert c.upstreams[0].api_key == "sk-up"
    assert c.upstreams[0].base_url == "http://127.0.0.1:8000/v1"


def test_env_expansion_and_defaults() -> None:
    env = {"A": "x"}
    assert expand_env("${A}-${B:-dflt}-${C}", env) == "x-dflt-"


def test_overrides_merge_into_the_file(tmp_path: Path) -> None:
    p = write(tmp_path, "budget: {default_turns: 7, on_exhausted: finish}\n")
    c = load_config(p, {"budget": {"default_turns": 9}})
    assert c.budget.default_turns == 9 and c.budget.on_exhausted == "finish"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("budget: {on_exhausted: explode}\n", "budget.on_exhausted"),
        ("budget: {default_turns: 0}\n", "budget.default_turns"),
        ("budget: {bogus: 1}\n", "budget.bogus"),
        ("nonsense: {}\n", "nonsense"),
        ("server: {port: many}\n", "server.port"),
        ("upstreams: [{name: a}]\n", "upstreams.0.base_url"),
        ("upstreams: [{base_url: 'ftp://x'}]\n", "upstreams.0.base_url"),
        ("disclosure: {template: 'Turn {bogus}'}\n", "disclosure.template"),
        ("disclosure: {placement: middle}\n", "disclosure.placement"),
        ("episodes: {budget_headers: sometimes}\n", "episodes.budget_headers"),
        ("trajectories: {content: some}\n", "trajectories.content"),
        ("auth: {keys: nope}\n", "auth.keys"),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(key + ":"), message


def test_not_yaml_and_not_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"line \d+: not valid YAML"):
        load_config(write(tmp_path, "budget: [unclosed\n"))
    with pytest.raises(ConfigError, match="mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))
    with pytest.raises(ConfigError, match="missing.yaml"):
        load_config(tmp_path / "missing.yaml")
