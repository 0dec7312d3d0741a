"""The Helm chart renders, its manifests match the Kubernetes schemas, its config loads.

Rendering uses Helm's own engine (Helm v4 through the helm-python-sdk bindings, offline);
kubernetes-validate checks the manifests against the Kubernetes OpenAPI schemas in strict
mode (unknown fields are errors). No cluster is involved.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from budgetproxy.config import load_config

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "budgetproxy"
NAMESPACE = "agents"
RELEASE = "bp"
BASE_VALUES: dict[str, Any] = {
    "upstream": {"baseUrl": "http://vllm.models.svc:8000/v1"},
    "redis": {"url": "redis://redis.data.svc:6379/0"},
    "secret": {"env": {"UPSTREAM_API_KEY": "sk-test-not-in-configmap"}},
}
ALL_OPTIONS: dict[str, Any] = {
    "upstream": {"baseUrl": "http://vllm.models.svc:8000/v1"},
    "redis": {"bundled": {"enabled": True}},
    "autoscaling": {"enabled": True},
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "otel": {"endpoint": "http://otel-collector.observability:4318"},
    "trajectories": {"existingClaim": "budgetproxy-trajectories"},
}
# Oldest Kubernetes the chart declares (Chart.yaml kubeVersion) and the newest schemas.
KUBERNETES_VERSIONS = ["1.25.0", "latest"]


def _helm() -> Any:
    try:
        import helm_python
    except ImportError:
        pytest.fail("helm-python-sdk is not installed (the [dev] extra)", pytrace=False)
    return helm_python


def _kubernetes_validate() -> Any:
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail("kubernetes-validate is not installed (the [dev] extra)", pytrace=False)
    return kubernetes_validate


def merged(*layers: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merged(out[key], value)
            else:
                out[key] = copy.deepcopy(value)
    return out


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    """The chart's manifests for these values, as parsed objects (NOTES.txt left out)."""
    helm = _helm()
    with helm.Chart.load(str(CHART)) as chart:
        files = chart.render(values=values, name=RELEASE, namespace=NAMESPACE)
    docs = []
    for name, text in sorted(files.items()):
        if not name.endswith(".txt"):
            docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def one(docs: list[dict[str, Any]], kind: str, component: str = "proxy") -> dict[str, Any]:
    found = [
        d
        for d in docs
        if d["kind"] == kind
        and d["metadata"].get("labels", {}).get("app.kubernetes.io/component", component)
        == component
    ]
    assert len(found) == 1, f"{len(found)} {kind} objects for {component}"
    return found[0]


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == "budgetproxy")


def render_error(values: dict[str, Any]) -> str:
    helm = _helm()
    with pytest.raises(helm.HelmRenderError) as info:
        render(values)
    return str(info.value)


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return render(BASE_VALUES)


@pytest.fixture(scope="module")
def all_docs() -> list[dict[str, Any]]:
    return render(ALL_OPTIONS)


def every_rendering() -> Iterator[tuple[str, dict[str, Any]]]:
    yield "defaults", BASE_VALUES
    yield "all-options", ALL_OPTIONS
    yield "existing-secret", merged(BASE_VALUES, {"secret": {"existingSecret": "upstream-keys"}})


RENDERINGS = [pytest.param(label, values, id=label) for label, values in every_rendering()]


# ---- schemas and lint ------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(("label", "values"), RENDERINGS)
def test_manifests_match_kubernetes_schemas(
    label: str, values: dict[str, Any], version: str
) -> None:
    kv = _kubernetes_validate()
    target = kv.latest_version() if version == "latest" else version
    for doc in render(values):
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: no schema in kubernetes-validate; see the ServiceMonitor test
        try:
            kv.validate(doc, target, strict=True)
        except kv.ValidationError as e:
            pytest.fail(f"{label}: {doc['kind']} {doc['metadata']['name']}: {e.message}")


def test_schema_check_rejects_a_broken_manifest(docs: list[dict[str, Any]]) -> None:
    """The strict schema check is not vacuous: a misspelt field fails it."""
    kv = _kubernetes_validate()
    broken = copy.deepcopy(one(docs, "Deployment"))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, kv.latest_version(), strict=True)


def test_helm_lint_passes() -> None:
    helm = _helm()
    for _, values in every_rendering():
        result = helm.lint(str(CHART), values)
        assert result["errors"] == [], result


# ---- the Deployment --------------------------------------------------------------------------


def test_two_replicas_by_default(docs: list[dict[str, Any]]) -> None:
    assert one(docs, "Deployment")["spec"]["replicas"] == 2


def test_probes_on_healthz_and_readyz(docs: list[dict[str, Any]]) -> None:
    c = container(docs)
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert c["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]


def test_runs_as_non_root(docs: list[dict[str, Any]]) -> None:
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    security = container(docs)["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"] for m in container(docs)["volumeMounts"]}
    assert {"/tmp", "/var/lib/budgetproxy/trajectories"} <= mounts


def test_grace_period_covers_prestop_and_shutdown(docs: list[dict[str, Any]]) -> None:
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    command = container(docs)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    config = yaml.safe_load(one(docs, "ConfigMap")["data"]["config.yaml"])
    shutdown = config["server"]["shutdown_timeout_s"]
    assert pod["terminationGracePeriodSeconds"] > shutdown + float(command[1])


def test_config_from_configmap_and_keys_from_secret(docs: list[dict[str, Any]]) -> None:
    c = container(docs)
    configmap = one(docs, "ConfigMap")
    secret = one(docs, "Secret")
    assert c["args"] == ["serve", "--config", "/etc/budgetproxy/config.yaml"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
    assert mount["mountPath"] == "/etc/budgetproxy" and "config.yaml" in configmap["data"]
    volume = next(
        v for v in one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
        if v["name"] == "config"
    )  # fmt: skip
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    assert c["envFrom"] == [{"secretRef": {"name": secret["metadata"]["name"]}}]
    assert secret["stringData"] == {"UPSTREAM_API_KEY": "sk-test-not-in-configmap"}
    assert "sk-test" not in yaml.safe_dump(configmap)
    assert "${UPSTREAM_API_KEY" in configmap["data"]["config.yaml"]


def test_existing_secret_replaces_the_chart_secret() -> None:
    docs = render(merged(BASE_VALUES, {"secret": {"existingSecret": "upstream-keys"}}))
    assert not [d for d in docs if d["kind"] == "Secret"]
    assert container(docs)["envFrom"] == [{"secretRef": {"name": "upstream-keys"}}]


@pytest.mark.parametrize(("label", "values"), RENDERINGS)
def test_rendered_proxy_config_loads(label: str, values: dict[str, Any], tmp_path: Path) -> None:
    """The ConfigMap's config passes budgetproxy's strict loader with the pod's environment."""
    docs = render(values)
    c = container(docs)
    environ = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    environ |= {"POD_NAME": "bp-budgetproxy-abc12", "POD_NAMESPACE": NAMESPACE}
    secrets = [d for d in docs if d["kind"] == "Secret"]
    environ |= secrets[0]["stringData"] if secrets else {"UPSTREAM_API_KEY": "from-existing"}
    path = tmp_path / "config.yaml"
    path.write_text(one(docs, "ConfigMap")["data"]["config.yaml"], encoding="utf-8")
    config = load_config(path, environ=environ)
    assert config.store.kind == "redis" and config.store.url.startswith("redis://")
    assert config.server.host == "0.0.0.0" and config.server.port == c["ports"][0]["containerPort"]
    assert config.upstreams[0].base_url == values["upstream"]["baseUrl"]
    assert config.trajectories.dir.endswith("/bp-budgetproxy-abc12")


def test_otel_environment(all_docs: list[dict[str, Any]]) -> None:
    env = {e["name"]: e.get("value") for e in container(all_docs)["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == ALL_OPTIONS["otel"]["endpoint"]
    assert env["OTEL_SERVICE_NAME"] == "budgetproxy"
    assert "k8s.pod.name=$(POD_NAME)" in env["OTEL_RESOURCE_ATTRIBUTES"]
    names = [e["name"] for e in container(all_docs)["env"]]
    assert names.index("POD_NAME") < names.index("OTEL_RESOURCE_ATTRIBUTES")
    # one trace in ten by default; the proxy reads these through the SDK's sampler
    assert env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
    assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.1"


# ---- Service, HPA, ServiceMonitor, bundled Redis ---------------------------------------------


def test_service_selects_the_proxy_pods_only(all_docs: list[dict[str, Any]]) -> None:
    service = one(all_docs, "Service")
    proxy_pods = one(all_docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    redis_pods = one(all_docs, "Deployment", "redis")["spec"]["template"]["metadata"]["labels"]
    selector = service["spec"]["selector"].items()
    assert selector <= proxy_pods.items() and not selector <= redis_pods.items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_hpa_replaces_fixed_replicas(all_docs: list[dict[str, Any]]) -> None:
    hpa = one(all_docs, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["name"] == one(all_docs, "Deployment")["metadata"]["name"]
    assert "replicas" not in one(all_docs, "Deployment")["spec"]


def test_optional_objects_are_off_by_default(docs: list[dict[str, Any]]) -> None:
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ConfigMap", "Secret", "PodDisruptionBudget"} <= kinds
    assert not kinds & {"HorizontalPodAutoscaler", "ServiceMonitor"}
    assert len([d for d in docs if d["kind"] == "Deployment"]) == 1, "no Redis unless bundled"


def test_service_monitor_scrapes_each_pod(all_docs: list[dict[str, Any]]) -> None:
    monitor = one(all_docs, "ServiceMonitor")
    service = one(all_docs, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert endpoint["path"] == "/metrics"
    # Only fields the monitoring.coreos.com/v1 ServiceMonitor spec defines.
    assert set(monitor["spec"]) <= {"selector", "namespaceSelector", "endpoints", "jobLabel"}
    assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "scheme"}


def test_bundled_redis_is_the_store(all_docs: list[dict[str, Any]]) -> None:
    redis_service = one(all_docs, "Service", "redis")
    env = {e["name"]: e.get("value") for e in container(all_docs)["env"]}
    assert env["REDIS_URL"] == f"redis://{redis_service['metadata']['name']}:6379/0"


# ---- refusals --------------------------------------------------------------------------------


def test_refuses_memory_store_with_several_replicas() -> None:
    values = merged(BASE_VALUES, {"config": {"store": {"kind": "memory"}}})
    assert "config.store.kind" in render_error(values)
    single = merged(values, {"replicaCount": 1})
    assert one(render(single), "Deployment")["spec"]["replicas"] == 1
    several_workers = merged(single, {"config": {"server": {"workers": 4}}})
    assert "config.store.kind" in render_error(several_workers)


def test_refuses_a_grace_period_shorter_than_the_drain() -> None:
    values = merged(BASE_VALUES, {"terminationGracePeriodSeconds": 20})
    assert "terminationGracePeriodSeconds" in render_error(values)


def test_refuses_missing_upstream_and_redis() -> None:
    assert "upstream.baseUrl" in render_error({"redis": BASE_VALUES["redis"]})
    assert "redis.url" in render_error({"upstream": BASE_VALUES["upstream"]})
    in_secret = {"upstream": BASE_VALUES["upstream"], "secret": {"env": {"REDIS_URL": "redis://x"}}}
    assert "REDIS_URL" not in {e["name"] for e in container(render(in_secret))["env"]}
