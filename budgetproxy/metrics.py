"""Prometheus metrics: each defined once, fed from finished records, never driving logic."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0, 600.0,
)
OVERHEAD_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)
MAX_MODEL_LABELS = 32


class Metrics:
    """The proxy's metric families on an injected registry."""

    def __init__(self, registry: CollectorRegistry, turn_buckets: int = 64) -> None:
        ep = ("tier", "disclosure")
        self.turns = Counter(
            "budgetproxy_turns", "Charged turns forwarded upstream.", ep, registry=registry
        )
        self.episodes_started = Counter(
            "budgetproxy_episodes_started", "Episodes created.", ep, registry=registry
        )
        self.episodes_finished = Counter(
            "budgetproxy_episodes_finished",
            "Episodes ended, by end reason (outcome).",
            (*ep, "outcome"),
            registry=registry,
        )
        self.episode_turns = Histogram(
            "budgetproxy_episode_turns",
            "Turns used per finished episode (success_turn for successes).",
            (*ep, "outcome"),
            buckets=tuple(float(t) for t in range(1, turn_buckets + 1)),
            registry=registry,
        )
        self.budget_exhausted = Counter(
            "budgetproxy_budget_exhausted",
            "Model calls refused or finished because the episode's budget was spent.",
            ep,
            registry=registry,
        )
        self.request_duration = Histogram(
            "budgetproxy_request_duration_seconds",
            "Time from request to the last response byte, by route template.",
            ("route",),
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.upstream_duration = Histogram(
            "budgetproxy_upstream_duration_seconds",
            "Time spent waiting on the upstream, by upstream name.",
            ("upstream",),
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.overhead = Histogram(
            "budgetproxy_proxy_overhead_seconds",
            "Time the proxy added to a model call (total minus upstream).",
            ("route",),
            buckets=OVERHEAD_BUCKETS,
            registry=registry,
        )
        self.ttft = Histogram(
            "budgetproxy_time_to_first_token_seconds",
            "Time from request to the first streamed chunk sent to the client.",
            ("model",),
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.tokens = Counter(
            "budgetproxy_tokens",
            "Tokens reported by upstream usage, by direction (input|output).",
            ("model", "direction"),
            registry=registry,
        )
        self.upstream_errors = Counter(
            "budgetproxy_upstream_errors",
            "Upstream failures by class (connect|timeout|status_4xx|status_429|status_5xx|"
            "stream_broken).",
            ("upstream", "class"),
            registry=registry,
        )
        self.requests = Counter(
            "budgetproxy_requests", "Requests answered, by route and status.", ("route", "code"),
            registry=registry,
        )
        self.active_episodes = Gauge(
            "budgetproxy_active_episodes",
            "Episodes started and not yet ended (summed over replicas).",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.calls_without_episode = Counter(
            "budgetproxy_calls_without_episode",
            "Model calls forwarded with no episode id (or to an uncounted model).",
            ("route",),
            registry=registry,
        )
        self.queue_depth = Gauge(
            "budgetproxy_trajectory_queue_depth",
            "Trajectory records waiting to be written.",
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.store_unavailable = Counter(
            "budgetproxy_store_unavailable",
            "Model calls that met an unreachable store, by the policy applied.",
            ("policy",),
            registry=registry,
        )
        self._models: set[str] = set()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._episode_labels: set[tuple[str, str]] = set()

    OUTCOMES = ("success", "failure", "exhausted", "abandoned")
    ERROR_CLASSES = ("connect", "timeout", "status_4xx", "status_429", "status_5xx",
                     "stream_broken")

    def touch_episode_labels(self, tier: str, arm: str) -> None:
        """Create a (tier, arm)'s series at zero so rate() sees their first increment."""
        if (tier, arm) in self._episode_labels:
            return
        self._episode_labels.add((tier, arm))
        self.turns.labels(tier, arm)
        self.budget_exhausted.labels(tier, arm)
        for outcome in self.OUTCOMES:
            self.episodes_finished.labels(tier, arm, outcome)
            self.episode_turns.labels(tier, arm, outcome)

    def touch_upstream_labels(self, upstream: str) -> None:
        self.upstream_duration.labels(upstream)
        for cls in self.ERROR_CLASSES:
            self.upstream_errors.labels(upstream, cls)

    def child(self, family: Any, *labels: str) -> Any:
        """`family.labels(*labels)`, cached: the hot path takes each child in a dict lookup."""
        key = (id(family), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = family.labels(*labels)
        return found

    def model_label(self, model: str | None) -> str:
        """Bound the model label: the first MAX_MODEL_LABELS names, then "other"."""
        if not model:
            return "unknown"
        if model in self._models:
            return model
        if len(self._models) < MAX_MODEL_LABELS:
            self._models.add(model)
            return model
        return "other"
