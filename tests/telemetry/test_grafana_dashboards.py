"""The Grafana dashboards and provisioning files: JSON shape, variables, and PromQL syntax."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_support import (
    DASHBOARD_DIR,
    DATASOURCE,
    GRAFANA,
    METRICS,
    REPO,
    SAMPLE_VALUES,
    SERIES_NAMES,
    dashboards,
    panel_queries,
    promtool,
    substitute,
    variables_in,
)

EXPECTED = {
    "agent-budgets.json": ("budgetproxy-agent-budgets", "Agent budgets"),
    "proxy-health.json": ("budgetproxy-proxy-health", "Proxy health"),
    "experiments.json": ("budgetproxy-experiments", "Live experiments"),
}
REQUIRED_VARIABLES = {
    "agent-budgets.json": {"tier", "arm"},
    "proxy-health.json": {"model"},
    "experiments.json": {"experiment"},
}
# Grafana's built-in variables the panels may use.
BUILTINS = {"__range", "__rate_interval", "__interval"}
PANEL_TYPES = {"row", "stat", "timeseries", "bargauge", "barchart", "heatmap", "table"}
_SELECTOR = re.compile(r"\b(budgetproxy_\w+)(\{([^}]*)\})?")
_MATCHER_LABEL = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")

BOARDS = dashboards()
QUERIES = panel_queries()


def _panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in board["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def _variables(board: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in board["templating"]["list"]}


def test_the_expected_dashboards_exist_with_stable_uids() -> None:
    assert set(EXPECTED) <= set(BOARDS)
    for name, (uid, title) in EXPECTED.items():
        assert BOARDS[name]["uid"] == uid
        assert BOARDS[name]["title"] == title
    uids = [b["uid"] for b in BOARDS.values()]
    assert len(uids) == len(set(uids))


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_dashboard_top_level_shape(name: str) -> None:
    board = BOARDS[name]
    assert board["schemaVersion"] == 39
    assert board["id"] is None, "an exported id would clash on import; keep it null"
    assert re.fullmatch(r"[a-z0-9-]{1,40}", board["uid"])
    assert board["title"] and board["panels"]
    assert isinstance(board["templating"]["list"], list)
    assert {"from", "to"} <= set(board["time"])
    assert "budgetproxy" in board["tags"]


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_panels_have_ids_grid_positions_and_no_overlap(name: str) -> None:
    panels = _panels(BOARDS[name])
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    titles = [p["title"] for p in panels]
    assert len(titles) == len(set(titles)), (
        "panel titles must be unique (tests find panels by them)"
    )
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        assert p["type"] in PANEL_TYPES, p["type"]
        assert p.get("title"), f"panel {p['id']} has no title"
        g = p["gridPos"]
        assert all(isinstance(g[k], int) for k in ("h", "w", "x", "y")), g
        assert g["h"] >= 1 and g["w"] >= 1 and g["x"] >= 0 and g["y"] >= 0, g
        assert g["x"] + g["w"] <= 24, f"{p['title']} is wider than the grid"
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                other = cells.setdefault((x, y), p["title"])
                assert other == p["title"], f"{p['title']} overlaps {other}"


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_panel_queries_the_provisioned_datasource(name: str) -> None:
    for p in _panels(BOARDS[name]):
        if p["type"] == "row":
            assert not p.get("targets")
            continue
        assert p.get("description"), f"{p['title']} has no description"
        assert p["datasource"] == DATASOURCE, p["title"]
        assert p["targets"], f"{p['title']} has no targets"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == DATASOURCE, p["title"]
            assert isinstance(t["expr"], str) and t["expr"].strip(), p["title"]
            assert t["instant"] != t["range"], f"{p['title']}: one of instant or range"


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_template_variables_exist_are_used_and_cover_every_reference(name: str) -> None:
    board = BOARDS[name]
    variables = _variables(board)
    assert REQUIRED_VARIABLES[name] <= set(variables)
    exprs = [t["expr"] for p in _panels(board) for t in p.get("targets", [])]
    used = set().union(*(variables_in(e) for e in exprs))
    assert used <= set(variables) | BUILTINS, f"undefined: {used - set(variables) - BUILTINS}"
    assert set(variables) <= used, f"defined but unused: {set(variables) - used}"
    assert set(variables) | BUILTINS <= set(SAMPLE_VALUES)


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_query_variables_use_label_values_on_the_datasource(name: str) -> None:
    for var in _variables(BOARDS[name]).values():
        if var["type"] != "query":
            assert var["type"] in ("custom", "interval")
            assert var["query"] and var["options"]
            continue
        assert var["datasource"] == DATASOURCE
        m = re.fullmatch(r"label_values\((\w+), (\w+)\)", var["definition"])
        assert m, var["definition"]
        assert var["query"]["query"] == var["definition"]
        metric, label = m.groups()
        assert metric in SERIES_NAMES, metric
        assert label in SERIES_NAMES[metric], f"{metric} has no label {label}"
        assert var["multi"] and var["includeAll"] and var["allValue"] == ".*"


def test_episode_panels_filter_by_tier_and_arm() -> None:
    for q in QUERIES:
        for m in _SELECTOR.finditer(q.target["expr"]):
            if "tier" in METRICS.get(re.sub(r"_(bucket|sum|count)$", "", m.group(1)), set()):
                matchers = m.group(3) or ""
                assert 'tier=~"$tier"' in matchers, f"{q.name}: {m.group(0)}"
                assert 'disclosure=~"$arm"' in matchers or re.search(
                    r'disclosure="(hidden|disclosed)"', matchers
                ), f"{q.name}: {m.group(0)}"


def test_queries_use_only_exported_metrics_and_their_labels() -> None:
    for q in QUERIES:
        names = _SELECTOR.findall(q.target["expr"])
        assert names, f"{q.name} uses no budgetproxy metric"
        for metric, _, matchers in names:
            assert metric in SERIES_NAMES, f"{q.name}: unknown metric {metric}"
            labels = set(_MATCHER_LABEL.findall(matchers)) - {"le"}
            assert labels <= SERIES_NAMES[metric], f"{q.name}: {metric} has no {labels}"


def test_every_query_parses_with_promtool(tmp_path: Path) -> None:
    rules = [
        {"record": f"budgetproxy_dashboard:query_{i}", "expr": substitute(q.target["expr"])}
        for i, q in enumerate(QUERIES)
    ]
    for expr in (r["expr"] for r in rules):
        assert "$" not in expr and "[[" not in expr, expr
    path = tmp_path / "dashboard_queries.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_substitution_matches_grafana_variable_syntax() -> None:
    expr = 'x{a=~"$tier",b=~"${arm}",le=~"(${turns:pipe})"}[$__rate_interval] offset [[window]]'
    assert substitute(expr, {"tier": "25%"}) == 'x{a=~"25%",b=~".*",le=~"(5|10|20)"}[1m] offset 10m'
    with pytest.raises(KeyError):
        substitute("$nope")


def test_datasource_provisioning_matches_the_dashboards() -> None:
    doc = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yaml").read_text())
    assert doc["apiVersion"] == 1
    [ds] = doc["datasources"]
    assert ds["uid"] == DATASOURCE["uid"]
    assert ds["type"] == DATASOURCE["type"]
    assert ds["url"] == "http://prometheus:9090"
    assert ds["access"] == "proxy"


def test_dashboard_provisioning_points_at_the_mounted_folder() -> None:
    doc = yaml.safe_load((GRAFANA / "provisioning/dashboards/budgetproxy.yaml").read_text())
    assert doc["apiVersion"] == 1
    [provider] = doc["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"


def test_compose_mounts_the_provisioning_and_dashboards_where_grafana_looks() -> None:
    compose_file = REPO / "deploy" / "docker-compose.yml"
    services = yaml.safe_load(compose_file.read_text())["services"]
    mounts = {}
    for volume in services["grafana"]["volumes"]:
        host, container = volume.split(":")[:2]
        mounts[container] = (compose_file.parent / host).resolve()
    assert mounts["/etc/grafana/provisioning"] == GRAFANA / "provisioning"
    assert mounts["/var/lib/grafana/dashboards"] == DASHBOARD_DIR
    assert "prometheus" in services, "the datasource url names the compose service prometheus"


def test_committed_dashboards_are_what_the_generator_writes() -> None:
    spec = importlib.util.spec_from_file_location("grafana_generate", GRAFANA / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert set(module.DASHBOARDS) == {p.name for p in DASHBOARD_DIR.glob("*.json")}
    for name, build in module.DASHBOARDS.items():
        committed = (DASHBOARD_DIR / name).read_text(encoding="utf-8")
        assert module.render(build) == committed, (
            f"{name} differs from grafana/generate.py's output; run `python grafana/generate.py`"
        )


def test_every_bucket_variable_option_picks_exactly_its_own_bucket() -> None:
    """The T and B variables' values go into `le=~"(v1|v2)(\\.0)?"`: each option must match
    its own bucket bound alone, as Prometheus 2 (le="5.0") and 3 (le="5") spell it — a dot in
    an option is a regex wildcard ("1.0" would pick le="100.0" as well)."""
    from prometheus_client.utils import floatToGoString

    from budgetproxy.telemetry.metrics import COST_BUCKETS, SECONDS_BUCKETS, TOKEN_BUCKETS

    buckets = {"turns": [float(t) for t in range(1, 65)], "tokens": TOKEN_BUCKETS,
               "cost": COST_BUCKETS, "seconds": SECONDS_BUCKETS}
    variables = _variables(BOARDS["agent-budgets.json"])
    exprs = [t["expr"] for p in _panels(BOARDS["agent-budgets.json"]) for t in p.get("targets", [])]
    for name, bounds in buckets.items():
        assert any(f'le=~"(${{{name}:pipe}})(\\\\.0)?"' in e for e in exprs), name
        labels = {floatToGoString(b): b for b in bounds}
        labels |= {text.removesuffix(".0"): b for text, b in list(labels.items())}
        for option in variables[name]["options"]:
            value = option["value"]
            picked = {b for text, b in labels.items() if re.fullmatch(f"({value})(\\.0)?", text)}
            assert picked == {float(value)}, (name, value, picked)
