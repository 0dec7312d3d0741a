"""Configuration: one typed, validated object loaded from YAML, env vars and CLI flags."""

from __future__ import annotations

import difflib
import fnmatch
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

# Every environment variable the proxy itself reads is named here.
ENV_CONFIG_FILE = "BUDGETPROXY_CONFIG"
ENV_MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"

_SUBKEY = re.compile(r"[a-z_]+: ")
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(ValueError):
    """Configuration problems, each phrased as one line naming its key (`problems`); the
    message is those lines."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0)
    shutdown_timeout_s: float = Field(30.0, ge=0)
    workers: int = Field(1, ge=1)
    # Bounds on what a client may hold open or send before the app sees a request
    # (docs/security.md): past them 431, 408 or 503, and the connection is closed.
    max_header_bytes: int = Field(64 * 1024, ge=1024)
    max_headers: int = Field(100, ge=8)
    header_timeout_s: float = Field(30.0, gt=0)
    body_timeout_s: float = Field(120.0, gt=0)
    max_connections: int = Field(4096, ge=1)
    max_connections_per_client: int | None = Field(None, ge=1)
    # Globs of request header names forwarded upstream beyond the built-in list
    # (core/forwarded_headers.py), e.g. ["x-my-gateway-*"].
    forward_headers: list[str] = Field(default_factory=list)
    # glibc only: every this many seconds the C heap's free pages go back to the system
    # (serve/allocator.py); null: never, and the heap keeps what large bodies freed.
    malloc_trim_s: float | None = Field(2.0, gt=0)


class UpstreamConfig(_Strict):
    name: str = "default"
    base_url: str
    api_key: str | None = None
    models: list[str] = Field(default_factory=lambda: ["*"])
    timeout_s: float = Field(600.0, gt=0)
    connect_timeout_s: float = Field(10.0, gt=0)
    inject_stream_usage: bool = True
    kind: Literal["openai", "litellm"] = "openai"
    # litellm only: the provider model to call, e.g. "anthropic/claude-sonnet-4-5".
    model: str | None = None
    # Ask the server for the sampled token ids and logprobs and log them with each turn
    # (chat and text completions); the client's response is unchanged (proxy/capture.py).
    capture_tokens: bool = False
    # Whose field names and shapes: vLLM (null when not asked) or SGLang (absent).
    token_server: Literal["vllm", "sglang"] = "vllm"
    # Model calls to an http:// upstream go through budgetproxy's own HTTP/1.1 client
    # (proxy/h1.py, ~10x less CPU a call than aiohttp); https:// upstreams, and "aiohttp"
    # here, use aiohttp.
    http_client: Literal["builtin", "aiohttp"] = "builtin"
    # The built-in client's keep-alive (docs/security.md): a kept connection is reused only
    # after `reuse_quiet_s` with no byte from the upstream; false gives every call a
    # connection of its own, so no answer can reach another call whatever the upstream sends.
    reuse_connections: bool = True
    reuse_quiet_s: float = Field(0.25, ge=0, le=60)

    @field_validator("base_url")
    @classmethod
    def _strip_slash(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https:// (got {v!r})")
        v = v.rstrip("/")
        if "/" not in v.split("://", 1)[1]:
            # A bare host would send /chat/completions to the server root: every call a 404
            # that spends a turn. OpenAI-compatible base URLs end in /v1.
            raise ValueError(f"needs the API path, e.g. {v}/v1 (got {v!r})")
        return v

    @field_validator("api_key")
    @classmethod
    def _empty_key_is_none(cls, v: str | None) -> str | None:
        return v or None


class BudgetMixConfig(_Strict):
    max_turns: int = Field(20, ge=1)
    step: float = Field(0.1, gt=0, le=1)
    # Full budgets of other axes to draw over too (candidates at `step` of each), per group.
    max_tokens: int | None = Field(None, ge=1)
    max_cost_usd: float | None = Field(None, gt=0)
    max_time_s: float | None = Field(None, gt=0)


class FinishTexts(_Strict):
    """Finish mode's final reply, per axis that ran out; `{total}` is that axis's budget and
    `{used}` what the episode used of it."""

    turns: str = "[Turn budget exhausted] This episode has no turns left."
    tokens: str = "[Token budget exhausted] This episode has no tokens left."
    cost: str = "[Cost budget exhausted] This episode has no cost budget left."
    time: str = "[Time budget exhausted] This episode has no time left."

    @field_validator("turns", "tokens", "cost", "time")
    @classmethod
    def _text_renders(cls, v: str) -> str:
        try:
            v.format(total=2, used=1)
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"cannot render ({e!r}); allowed fields are {{total}} {{used}}"
                             ) from None
        return v


class BudgetConfig(_Strict):
    default_turns: int = Field(20, ge=1)
    on_exhausted: Literal["reject", "finish"] = "reject"
    finish_reason: str = "length"
    count_failed_turns: bool = False
    free_retries_per_turn: int = Field(2, ge=0)
    sampler: Literal["none", "budgetmix"] = "none"
    budgetmix: BudgetMixConfig = BudgetMixConfig()
    seed: int = 0
    # Budgets on the other axes of an episode that names none (None: no cap on that axis).
    default_tokens: int | None = Field(None, ge=1)
    default_cost_usd: float | None = Field(None, gt=0)
    default_time_s: float | None = Field(None, gt=0)
    # Output tokens held for a call that sets no output cap while more is left (no cap is
    # added then: APIs refuse caps past a model's own maximum). Set to the model's maximum.
    output_hold_tokens: int = Field(16384, ge=1)
    # Finish mode: the final reply's text per axis that ran out (fields {total}, {used}), and
    # how many final replies an episode gets before later calls are refused episode_finished
    # (null: every call gets one).
    finish_texts: FinishTexts = FinishTexts()
    finish_replies: int | None = Field(1, ge=1)


def _check_template(v: str) -> str:
    """A disclosure template renders with the fields the proxy fills in."""
    axis_fields = {f"{a}_{p}": 1 for a in ("tokens", "cost", "seconds")
                   for p in ("remaining", "total", "used")}
    try:
        v.format(turn=1, total=2, remaining=1, used=0, turns_remain="1 turn remains",
                 **axis_fields)
    except (KeyError, IndexError, ValueError) as e:
        allowed = "{turn} {total} {remaining} {used} {turns_remain} {tokens_remaining} "\
            "{tokens_total} {tokens_used} {cost_remaining} {cost_total} {cost_used} "\
            "{seconds_remaining} {seconds_total} {seconds_used}"
        raise ValueError(f"cannot render ({e!r}); allowed fields are {allowed}") from None
    return v


class DisclosureConfig(_Strict):
    mode: Literal["hidden", "disclosed", "mixed"] = "hidden"
    disclosed_fraction: float = Field(0.5, ge=0, le=1)
    placement: Literal["last_message", "system", "new_message"] = "last_message"
    history: Literal["keep", "drop"] = "keep"
    template: str = "[Turn budget] Turn {turn} of {total}. {turns_remain} after this one."

    @field_validator("template")
    @classmethod
    def _template_renders(cls, v: str) -> str:
        return _check_template(v)


# Session headers agents send on every call, usable as episode-id aliases by name
# (episodes.id_header_presets). None is on by default: an agent pointed at the proxy would
# otherwise have every session capped at budget.default_turns without asking for it.
ID_HEADER_PRESETS: dict[str, str] = {
    "claude_code": "X-Claude-Code-Session-Id",
    "codex": "session-id",
    "litellm": "x-litellm-session-id",
    "helicone": "Helicone-Session-Id",
}


class EpisodesConfig(_Strict):
    id_headers: list[str] = Field(default_factory=lambda: ["X-Episode-Id"])
    id_header_presets: list[Literal["claude_code", "codex", "litellm", "helicone"]] = Field(
        default_factory=list)
    require_id: bool = False
    idle_timeout_s: float = Field(3600.0, gt=0)
    retention_s: float = Field(86400.0, ge=0)
    # At most this many finished episodes kept by the memory store (oldest evicted first; an
    # evicted id still refuses calls); None: as many as retention_s keeps.
    max_retained: int | None = Field(None, ge=0)
    uncounted_models: list[str] = Field(default_factory=list)
    # Exact texts of a call whose only message is that text (inspect-ai's capability probe,
    # "Please say 'hello, world'"): forwarded without spending a turn.
    uncounted_prompts: list[str] = Field(default_factory=list)
    budget_headers: Literal["always", "disclosed_only", "never"] = "always"
    sweep_interval_s: float = Field(5.0, gt=0)
    # What a compaction call (a CLI's summary request, core/compaction.py) of an episode is:
    # free (forwarded, not charged, no budget text, logged as a "compaction" record) or counted
    # (a turn like any other). Recognised for the presets in id_header_presets and here.
    compaction: Literal["free", "counted"] = "free"
    compaction_presets: list[Literal["claude_code", "codex"]] = Field(default_factory=list)

    def compaction_marks(self) -> list[str]:
        """The presets whose compaction calls are recognised."""
        named = [p for p in self.id_header_presets if p in ("claude_code", "codex")]
        return list(dict.fromkeys([*named, *self.compaction_presets]))

    def all_id_headers(self) -> list[str]:
        """The id headers in the order they are read: id_headers, then the presets'."""
        return [*self.id_headers, *(ID_HEADER_PRESETS[p] for p in self.id_header_presets)]


class TrajectoriesConfig(_Strict):
    enabled: bool = True
    dir: str = "./trajectories"
    content: Literal["full", "none"] = "full"
    max_file_bytes: int = Field(256 * 1024 * 1024, gt=0)
    gzip_rotated: bool = False
    queue_size: int = Field(10000, ge=1)
    # Records that follow a write within this many seconds wait for the next one, which
    # takes them all: at most one write a flush interval (a record after a quiet spell is
    # written at once). A file write costs a call more than the rest of its record when it
    # is the first in milliseconds (bench/README.md); 0: each record written as it comes.
    flush_interval_s: float = Field(0.2, ge=0, le=10)


class MetricsConfig(_Strict):
    enabled: bool = True
    turn_buckets: int = Field(64, ge=1, le=1000)


class TracingConfig(_Strict):
    # None: on when OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) is set.
    enabled: bool | None = None
    capture_content: bool = False


class StoreConfig(_Strict):
    kind: Literal["memory", "redis"] = "memory"
    url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "budgetproxy"
    # redis only: url names one node of a Redis Cluster; the others are discovered
    cluster: bool = False
    on_unavailable: Literal["fail_closed", "fail_open"] = "fail_closed"
    # redis only: connections per node besides the turns' pipelined one; a burst waits
    max_connections: int = Field(64, ge=1, le=10_000)


_TENANT = re.compile(r"[A-Za-z0-9._:\-]{1,64}")


def _nonblank_key(v: str) -> str:
    if not v.strip():
        raise ValueError("empty key (an unset environment variable?); remove it or set it")
    if v != v.strip():
        raise ValueError("a key may not start or end with whitespace")
    return v


class ClientKey(_Strict):
    """A client API key and the tenant whose episodes it sees (None: the default one)."""

    key: str
    tenant: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _plain_string(cls, v: Any) -> Any:
        return {"key": v} if isinstance(v, str) else v

    @field_validator("key")
    @classmethod
    def _key_set(cls, v: str) -> str:
        return _nonblank_key(v)

    @field_validator("tenant")
    @classmethod
    def _tenant_name(cls, v: str | None) -> str | None:
        if v is not None and _TENANT.fullmatch(v) is None:
            raise ValueError("a tenant is 1-64 characters of A-Z a-z 0-9 . _ : -")
        return v


class RewardConfig(_Strict):
    # zero: an exhausted episode's reward is 0 (BudgetMix RL); keep: what the harness reported.
    on_exhausted: Literal["zero", "keep"] = "keep"
    # Group advantages: reward minus the group mean, divided by the group's std when true.
    scale_by_std: bool = False


class RolloutsConfig(_Strict):
    # Keep each finished episode's turns (messages as the model saw them, tokens when
    # captured) for GET /v1/episodes/{id}/trajectory, for episodes.retention_s.
    keep_turns: bool = True
    max_bytes: int = Field(256 * 1024 * 1024, gt=0)  # memory store: all episodes' turns
    # Signs the per-episode keys POST /v1/episodes mints (api_key). Replicas need the same
    # one; none: each process draws its own at start.
    key_secret: str | None = Field(None, min_length=16)


class AuthConfig(_Strict):
    keys: list[ClientKey] = Field(default_factory=list)
    # One key per line, "KEY" or "KEY TENANT"; blank lines and lines starting with # skipped.
    keys_file: str | None = None
    admin_keys: list[str] = Field(default_factory=list)
    # Tenants metrics are labelled with (a bounded list; others count as "other").
    tenants: list[str] = Field(default_factory=list)
    _client_keys: list[ClientKey] = PrivateAttr(default_factory=list)

    @field_validator("admin_keys")
    @classmethod
    def _admin_keys_set(cls, v: list[str]) -> list[str]:
        for i, key in enumerate(v):
            try:
                _nonblank_key(key)
            except ValueError as e:
                raise ValueError(f"entry {i}: {e}") from None
        return v

    @field_validator("tenants")
    @classmethod
    def _tenant_names(cls, v: list[str]) -> list[str]:
        for i, name in enumerate(v):
            if _TENANT.fullmatch(name) is None:
                raise ValueError(f"entry {i}: a tenant is 1-64 characters of A-Z a-z 0-9 . _ : -")
        return v

    @model_validator(mode="after")
    def _read_keys_file(self) -> AuthConfig:
        keys = list(self.keys)
        if self.keys_file is not None:
            try:
                keys.extend(_keys_from_file(self.keys_file))
            except ValueError as e:
                raise ValueError(f"keys_file: {e}") from None
        self._client_keys = keys
        return self

    def client_keys(self) -> list[ClientKey]:
        """Every client key: `keys` and those read from `keys_file`."""
        return list(self._client_keys)

    @property
    def required(self) -> bool:
        """Whether requests need a key (any client or admin key is configured)."""
        return bool(self._client_keys or self.admin_keys)


def _keys_from_file(path: str) -> list[ClientKey]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) > 2:
            raise ValueError(f"{path} line {n}: expected 'KEY' or 'KEY TENANT'")
        try:
            out.append(ClientKey(key=words[0], tenant=words[1] if len(words) == 2 else None))
        except ValidationError as e:
            raise ValueError(f"{path} line {n}: {e.errors()[0]['msg']}") from None
    if not out:
        raise ValueError(f"{path} holds no key")
    return out


# Names of experiments and arms: metric label values, so short and plain.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class ArmConfig(_Strict):
    """One arm of an experiment: what an episode assigned to it gets (None: as configured)."""

    name: str = Field(pattern=NAME_PATTERN)
    disclosure: Literal["hidden", "disclosed"] | None = None
    announced_budget: int | None = Field(None, ge=1)
    budget: int | None = Field(None, ge=1)
    model: str | None = Field(None, min_length=1)
    template: str | None = None

    @field_validator("template")
    @classmethod
    def _template_renders(cls, v: str | None) -> str | None:
        return None if v is None else _check_template(v)


class ExperimentConfig(_Strict):
    """A live experiment (docs/experiments.md): arms assigned per unit, a running decision."""

    name: str = Field(pattern=NAME_PATTERN)
    unit: Literal["task", "group", "episode"] = "task"
    # What an episode's outcome is (core.experiment.metric_value): success, success within a
    # tier's turns, the reward, or the tokens or cost spent (lower is better for the last two).
    metric: Literal["success", "pass_at_tier", "reward", "tokens", "cost"] = "success"
    # The range outcomes are clipped to (reward: default [0, 1]; tokens, cost: max required).
    metric_min: float | None = Field(None, allow_inf_nan=False)
    metric_max: float | None = Field(None, allow_inf_nan=False)
    # pass_at_tier: the tier in percent of the episode's max_turns (T = tier x max_turns).
    tier: float | None = Field(None, gt=0, le=100)
    alpha: float = Field(0.05, gt=0, lt=1)
    # Futility: stop when the interval excludes every difference of at least this size (in
    # the metric's units).
    min_effect: float | None = Field(None, gt=0)
    arms: list[ArmConfig] = Field(min_length=2, max_length=16)
    stop: Literal["manual", "auto"] = "manual"
    # stop: auto, once decided: new episodes get the better arm (winner) or the first (control).
    on_stop: Literal["winner", "control"] = "winner"

    @field_validator("arms")
    @classmethod
    def _arm_names_unique(cls, v: list[ArmConfig]) -> list[ArmConfig]:
        names = [a.name for a in v]
        if len(set(names)) < len(names):
            raise ValueError(f"arm names must differ, got {names}")
        return v

    @model_validator(mode="after")
    def _metric_range(self) -> ExperimentConfig:
        m = self.metric
        if m in ("success", "pass_at_tier"):
            for key in ("metric_min", "metric_max"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key}: metric {m} is 0 or 1; it takes no range")
        if (m == "pass_at_tier") != (self.tier is not None):
            raise ValueError("tier: required for metric pass_at_tier" if self.tier is None
                             else f"tier: only for metric pass_at_tier, not {m}")
        if m in ("tokens", "cost") and self.metric_max is None:
            raise ValueError(f"metric_max: required for metric {m} (the most an episode may "
                             "spend; spend above it counts as this much)")
        low, high = self.bounds
        if low < 0 and m in ("tokens", "cost"):
            raise ValueError(f"metric_min: spend is never negative, got {low}")
        if not low < high:
            raise ValueError(f"metric_max: must be above metric_min ({low}), got {high}")
        if self.min_effect is not None and self.min_effect > high - low:
            raise ValueError(f"min_effect: at most the metric's range ({high - low}), "
                             f"got {self.min_effect}")
        return self

    @property
    def bounds(self) -> tuple[float, float]:
        """The range the metric's outcomes are clipped to, in its units."""
        if self.metric in ("success", "pass_at_tier"):
            return 0.0, 1.0
        low = 0.0 if self.metric_min is None else self.metric_min
        high = (1.0 if self.metric == "reward" else low) if self.metric_max is None \
            else self.metric_max
        return low, high

    @property
    def lower_is_better(self) -> bool:
        """Spend (tokens, cost): the arm that spends less is the better one."""
        return self.metric in ("tokens", "cost")


class PriceConfig(_Strict):
    input_per_mtok: float = Field(0.0, ge=0)
    output_per_mtok: float = Field(0.0, ge=0)


class Config(_Strict):
    server: ServerConfig = ServerConfig()
    upstreams: list[UpstreamConfig] = Field(default_factory=list)
    budget: BudgetConfig = BudgetConfig()
    disclosure: DisclosureConfig = DisclosureConfig()
    episodes: EpisodesConfig = EpisodesConfig()
    trajectories: TrajectoriesConfig = TrajectoriesConfig()
    metrics: MetricsConfig = MetricsConfig()
    tracing: TracingConfig = TracingConfig()
    store: StoreConfig = StoreConfig()
    auth: AuthConfig = AuthConfig()
    # USD per million tokens by model glob, over the price library's (first match wins).
    prices: dict[str, PriceConfig] = Field(default_factory=dict)
    reward: RewardConfig = RewardConfig()
    rollouts: RolloutsConfig = RolloutsConfig()
    experiments: list[ExperimentConfig] = Field(default_factory=list, max_length=64)

    @model_validator(mode="after")
    def _check(self) -> Config:
        bm = self.budget.budgetmix
        if self.budget.sampler == "budgetmix" and round(1 / bm.step) < 1:
            raise ValueError("budget.budgetmix.step: must give at least one candidate")
        if self.server.workers > 1 and self.store.kind == "memory":
            raise ValueError(
                "server.workers: more than one worker needs a shared store (store.kind: redis); "
                "the memory store would give each worker its own budgets"
            )
        names = [e.name for e in self.experiments]
        if len(set(names)) < len(names):
            raise ValueError(f"experiments: names must differ, got {names}")
        for i, e in enumerate(self.experiments):
            for j, arm in enumerate(e.arms):
                if arm.model is not None and self.upstreams and not any(
                        fnmatch.fnmatchcase(arm.model, g) for u in self.upstreams
                        for g in u.models):
                    raise ValueError(f"experiments.{i}.arms.{j}.model: no upstream serves "
                                     f"model {arm.model!r}")
        return self


def expand_env(
    text: str, environ: Mapping[str, str] | None = None, unset: list[str] | None = None
) -> str:
    """Replace ${VAR} and ${VAR:-default}; an unset VAR without a default becomes "".

    Names of unset variables without a default are appended to `unset`, for error messages.
    """
    env = os.environ if environ is None else environ

    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in env:
            return env[name]
        if default is None and unset is not None:
            unset.append(name)
        return default or ""

    return _ENV_REF.sub(sub, text)


def _section_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The config section a validation error's location points into (list indexes skipped)."""
    model: type[BaseModel] = Config
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        inner = field.annotation
        for arg in (inner, *getattr(inner, "__args__", ())):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                model = arg
                break
        else:
            return None
    return model


def _unknown_key(loc: tuple[int | str, ...]) -> str:
    section = _section_at(loc[:-1])
    names = list(section.model_fields) if section is not None else []
    near = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.6)
    return f"unknown key (did you mean `{near[0]}`?)" if near else "unknown key"


def _format_errors(err: ValidationError) -> list[str]:
    """Every problem pydantic found in one pass, one line each naming its key. (Checks across
    sections run once each section is valid on its own: they show up on a later pass.)"""
    lines: list[str] = []
    for error in err.errors():
        line = _format_one(error)
        if line not in lines:
            lines.append(line)
    return lines


def _format_one(error: Any) -> str:
    key = ".".join(str(p) for p in error["loc"]) or "config"
    msg = error["msg"]
    if error["type"] == "extra_forbidden":
        msg = _unknown_key(tuple(error["loc"]))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if not error["loc"]:  # a check across sections, whose message names its own key
        return str(msg)
    if _SUBKEY.match(msg):  # a section's own check, naming the key within it
        return f"{key}.{msg}"
    return f"{key}: {msg}"


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def load_config(
    path: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> Config:
    """Load YAML (with ${ENV} expansion), apply overrides (nested dicts), validate.

    Raises ConfigError with one line naming the offending key.
    """
    raw: dict[str, Any] = {}
    unset: list[str] = []
    if path is not None:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"config file {p}: {e.strerror or e}") from None
        try:
            loaded = yaml.safe_load(expand_env(text, environ, unset))
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"config file {p}{where}: not valid YAML") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {p}: the top level must be a mapping of sections")
        raw = loaded
    if overrides:
        raw = _deep_merge(raw, overrides)
    try:
        return Config.model_validate(raw)
    except ValidationError as e:
        hint = f" (unset environment variable: {', '.join(sorted(set(unset)))})" if unset else ""
        raise ConfigError(*(line + hint for line in _format_errors(e))) from None


_SECRET_KEYS = frozenset({"api_key", "keys", "admin_keys", "key", "key_secret"})
_URL_PASSWORD = re.compile(r"(://[^:/@]*:)[^@]*@")


def _masked(value: Any, key: str = "") -> Any:
    if key in _SECRET_KEYS and value:
        if isinstance(value, list):
            return [_masked(v, "key") if isinstance(v, dict) else "***" for v in value]
        return "***"
    if isinstance(value, dict):
        return {k: _masked(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    if isinstance(value, str):
        return _URL_PASSWORD.sub(r"\1***@", value)
    return value


def effective_config(config: Config) -> str:
    """The whole effective config as YAML, with keys, API keys and URL passwords masked."""
    text: str = yaml.safe_dump(_masked(config.model_dump(mode="json")), sort_keys=False)
    return text
