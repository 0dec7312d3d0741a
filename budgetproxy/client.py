"""A small client for harness authors: create episodes on the proxy, bind OpenAI clients to them.

    from budgetproxy.client import BudgetClient

    with BudgetClient("http://127.0.0.1:8080") as proxy:
        episode = proxy.create_episode(max_turns=20, budget=10, task_id="t1")
        llm = episode.openai()              # an openai.OpenAI whose base URL is the episode's
        ...                                 # every call through `llm` is a turn of the episode
        episode.report(success=True)

`AsyncBudgetClient` is the same with ``await``. The episode API is spoken with httpx; errors
the proxy answers come back as `BudgetProxyError`, carrying the OpenAI-shaped error code
(``episode_not_found``, ``episode_exists``, ``outcome_conflict`` ...). httpx and openai come
with ``pip install 'budgetproxy[client]'`` and are imported when first needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

if TYPE_CHECKING:
    import httpx
    from openai import AsyncOpenAI, OpenAI

__all__ = ["AsyncBudgetClient", "AsyncEpisode", "BudgetClient", "BudgetProxyError", "Episode"]

Disclosure = Literal["hidden", "disclosed"]
# The key the OpenAI SDK is given when neither the caller nor its environment names one; the
# proxy forwards upstream with its own configured key.
PLACEHOLDER_API_KEY = "budgetproxy"


class BudgetProxyError(Exception):
    """An error answer of the episode API (or no answer at all: status None)."""

    def __init__(
        self,
        message: str,
        status: int | None = None,
        code: str | None = None,
        type: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.type = type
        self.param = param

    def __str__(self) -> str:
        where = f"{self.status} " if self.status is not None else ""
        return f"{where}{self.code or 'error'}: {self.message}"


def _proxy_root(url: str) -> str:
    """The proxy's root URL; a URL given with a trailing /v1 works too."""
    root = url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def _check(response: httpx.Response) -> dict[str, Any]:
    """The JSON body of a 2xx answer; a BudgetProxyError for anything else."""
    try:
        data = response.json()
    except ValueError:
        data = None
    if response.is_success and isinstance(data, dict):
        return data
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        raise BudgetProxyError(
            str(error.get("message") or response.reason_phrase),
            status=response.status_code,
            code=error.get("code"),
            type=error.get("type"),
            param=error.get("param"),
        )
    raise BudgetProxyError(
        f"unexpected answer from {response.request.url}: {response.text[:200]!r}",
        status=response.status_code,
    )


def _unreachable(root: str, exc: Exception) -> BudgetProxyError:
    return BudgetProxyError(f"cannot reach the proxy at {root}: {exc}", code="proxy_unreachable")


def _create_body(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def _outcome_body(
    success: bool, reward: float | None, success_turn: int | None, metadata: dict[str, Any] | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"success": success}
    if reward is not None:
        body["reward"] = reward
    if success_turn is not None:
        body["success_turn"] = success_turn
    if metadata:
        body["metadata"] = metadata
    return body


ClientT = TypeVar("ClientT", "OpenAI", "AsyncOpenAI")


@dataclass
class _EpisodeFields:
    """What the proxy said about an episode when it was created or looked up."""

    episode_id: str
    base_url: str
    budget: int | None = None
    max_turns: int | None = None
    tier: str | None = None
    disclosure: str | None = None
    announced_budget: int | None = None
    task_id: str | None = None
    group: str | None = None
    data: dict[str, Any] = field(default_factory=dict, repr=False)
    _api_key: str | None = field(default=None, repr=False)

    @classmethod
    def _from(cls, data: dict[str, Any], root: str, api_key: str | None) -> Any:
        eid = str(data["episode_id"])
        return cls(
            episode_id=eid,
            base_url=str(data.get("base_url") or f"{root}/episodes/{eid}/v1"),
            budget=data.get("budget"),
            max_turns=data.get("max_turns"),
            tier=data.get("tier"),
            disclosure=data.get("disclosure"),
            announced_budget=data.get("announced_budget"),
            task_id=data.get("task_id"),
            group=data.get("group"),
            data=data,
            _api_key=api_key,
        )

    @property
    def headers(self) -> dict[str, str]:
        """Headers that make any OpenAI client's call a turn of this episode."""
        return {"X-Episode-Id": self.episode_id}

    def _bind(
        self, factory: type[ClientT], like: ClientT | None, kwargs: dict[str, Any]
    ) -> ClientT:
        if like is not None:
            return like.with_options(base_url=self.base_url, **kwargs)
        import openai

        kwargs.setdefault("base_url", self.base_url)
        if self._api_key is not None:
            kwargs.setdefault("api_key", self._api_key)
        try:
            return factory(**kwargs)
        except openai.OpenAIError:  # no api_key anywhere: the proxy does not need one
            return factory(**{**kwargs, "api_key": PLACEHOLDER_API_KEY})

    def openai(self, like: OpenAI | None = None, **kwargs: Any) -> OpenAI:
        """An ``openai.OpenAI`` whose base URL is this episode's path-prefix URL.

        ``like``: derive from an existing client (sharing its connection pool) instead of
        making a new one; other keyword arguments go to the client.
        """
        import openai

        return self._bind(openai.OpenAI, like, kwargs)

    def async_openai(self, like: AsyncOpenAI | None = None, **kwargs: Any) -> AsyncOpenAI:
        """An ``openai.AsyncOpenAI`` whose base URL is this episode's path-prefix URL."""
        import openai

        return self._bind(openai.AsyncOpenAI, like, kwargs)


@dataclass
class Episode(_EpisodeFields):
    """An episode on the proxy, with blocking calls to report on it."""

    _client: BudgetClient | None = field(default=None, repr=False)

    def _owner(self) -> BudgetClient:
        if self._client is None:
            raise RuntimeError("this Episode is not attached to a BudgetClient")
        return self._client

    def report(
        self,
        success: bool,
        reward: float | None = None,
        success_turn: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Report the outcome; this finishes the episode. Returns the episode's final state."""
        return self._owner().report(self.episode_id, success, reward, success_turn, metadata)

    def end(self) -> dict[str, Any]:
        """Finish the episode with no report (end reason ``abandoned`` unless exhausted)."""
        return self._owner().end(self.episode_id)

    def status(self) -> dict[str, Any]:
        """The episode's current state: turns_used, remaining, status, outcome, end_reason ..."""
        return self._owner().status(self.episode_id)


@dataclass
class AsyncEpisode(_EpisodeFields):
    """An episode on the proxy, with awaitable calls to report on it."""

    _client: AsyncBudgetClient | None = field(default=None, repr=False)

    def _owner(self) -> AsyncBudgetClient:
        if self._client is None:
            raise RuntimeError("this AsyncEpisode is not attached to an AsyncBudgetClient")
        return self._client

    async def report(
        self,
        success: bool,
        reward: float | None = None,
        success_turn: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Report the outcome; this finishes the episode. Returns the episode's final state."""
        return await self._owner().report(
            self.episode_id, success, reward, success_turn, metadata
        )

    async def end(self) -> dict[str, Any]:
        """Finish the episode with no report (end reason ``abandoned`` unless exhausted)."""
        return await self._owner().end(self.episode_id)

    async def status(self) -> dict[str, Any]:
        """The episode's current state: turns_used, remaining, status, outcome, end_reason ..."""
        return await self._owner().status(self.episode_id)


def _require_client_extra() -> None:
    """The client needs httpx and openai, which the proxy itself does not: say how to get them."""
    import importlib.util

    missing = [m for m in ("httpx", "openai") if importlib.util.find_spec(m) is None]
    if missing:
        raise ModuleNotFoundError(
            f"budgetproxy.client needs {' and '.join(missing)}: "
            "pip install 'budgetproxy[client]'",
            name=missing[0],
        )


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class BudgetClient:
    """The proxy's episode API, blocking. ``proxy_url`` is the proxy's root (``/v1`` optional)."""

    def __init__(
        self,
        proxy_url: str,
        api_key: str | None = None,
        timeout: float = 30.0,
        http_client: httpx.Client | None = None,
    ) -> None:
        _require_client_extra()
        import httpx

        self.proxy_url = _proxy_root(proxy_url)
        self.api_key = api_key
        self._own = http_client is None
        self._http = http_client or httpx.Client(timeout=timeout)
        self._headers = _headers(api_key)

    def _call(self, method: str, path: str, json: dict[str, Any] | None = None) -> Any:
        import httpx

        try:
            response = self._http.request(
                method, f"{self.proxy_url}{path}", json=json, headers=self._headers
            )
        except httpx.TransportError as exc:
            raise _unreachable(self.proxy_url, exc) from exc
        return response

    def create_episode(
        self,
        budget: int | None = None,
        max_turns: int | None = None,
        task_id: str | None = None,
        group: str | None = None,
        disclosure: Disclosure | None = None,
        announced_budget: int | None = None,
        tags: dict[str, Any] | None = None,
        episode_id: str | None = None,
        token_budget: int | None = None,
        experiment: str | None = None,
        cost_budget: float | None = None,
        time_budget_s: float | None = None,
        min_turns: int | None = None,
    ) -> Episode:
        """``POST /v1/episodes``. Unset fields are left to the proxy (its defaults, BudgetMix)."""
        body = _create_body(
            episode_id=episode_id, budget=budget, max_turns=max_turns, task_id=task_id,
            group=group, disclosure=disclosure, announced_budget=announced_budget, tags=tags,
            token_budget=token_budget, experiment=experiment,
            cost_budget=cost_budget, time_budget_s=time_budget_s,
            min_turns=min_turns,
        )
        data = _check(self._call("POST", "/v1/episodes", body))
        episode: Episode = Episode._from(data, self.proxy_url, self.api_key)
        episode._client = self
        return episode

    def episode(self, episode_id: str) -> Episode:
        """An existing episode, looked up (``GET /v1/episodes/{id}``)."""
        episode: Episode = Episode._from(self.status(episode_id), self.proxy_url, self.api_key)
        episode._client = self
        return episode

    def status(self, episode_id: str) -> dict[str, Any]:
        return _check(self._call("GET", f"/v1/episodes/{episode_id}"))

    def report(
        self,
        episode_id: str,
        success: bool,
        reward: float | None = None,
        success_turn: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body = _outcome_body(success, reward, success_turn, metadata)
        return _check(self._call("POST", f"/v1/episodes/{episode_id}/outcome", body))

    def end(self, episode_id: str) -> dict[str, Any]:
        return _check(self._call("POST", f"/v1/episodes/{episode_id}/end"))

    def metrics(self) -> str:
        """The proxy's ``/metrics`` page (Prometheus text format)."""
        response = self._call("GET", "/metrics")
        if not response.is_success:
            _check(response)
        return str(response.text)

    def close(self) -> None:
        if self._own:
            self._http.close()

    def __enter__(self) -> BudgetClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncBudgetClient:
    """The proxy's episode API, for asyncio. ``proxy_url`` is the proxy's root."""

    def __init__(
        self,
        proxy_url: str,
        api_key: str | None = None,
        timeout: float = 30.0,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        _require_client_extra()
        import httpx

        self.proxy_url = _proxy_root(proxy_url)
        self.api_key = api_key
        self._own = http_client is None
        self._http = http_client or httpx.AsyncClient(timeout=timeout)
        self._headers = _headers(api_key)

    async def _call(self, method: str, path: str, json: dict[str, Any] | None = None) -> Any:
        import httpx

        try:
            response = await self._http.request(
                method, f"{self.proxy_url}{path}", json=json, headers=self._headers
            )
        except httpx.TransportError as exc:
            raise _unreachable(self.proxy_url, exc) from exc
        return response

    async def create_episode(
        self,
        budget: int | None = None,
        max_turns: int | None = None,
        task_id: str | None = None,
        group: str | None = None,
        disclosure: Disclosure | None = None,
        announced_budget: int | None = None,
        tags: dict[str, Any] | None = None,
        episode_id: str | None = None,
        token_budget: int | None = None,
        experiment: str | None = None,
        cost_budget: float | None = None,
        time_budget_s: float | None = None,
        min_turns: int | None = None,
    ) -> AsyncEpisode:
        """``POST /v1/episodes``. Unset fields are left to the proxy (its defaults, BudgetMix)."""
        body = _create_body(
            episode_id=episode_id, budget=budget, max_turns=max_turns, task_id=task_id,
            group=group, disclosure=disclosure, announced_budget=announced_budget, tags=tags,
            token_budget=token_budget, experiment=experiment,
            cost_budget=cost_budget, time_budget_s=time_budget_s,
            min_turns=min_turns,
        )
        data = _check(await self._call("POST", "/v1/episodes", body))
        episode: AsyncEpisode = AsyncEpisode._from(data, self.proxy_url, self.api_key)
        episode._client = self
        return episode

    async def episode(self, episode_id: str) -> AsyncEpisode:
        """An existing episode, looked up (``GET /v1/episodes/{id}``)."""
        data = await self.status(episode_id)
        episode: AsyncEpisode = AsyncEpisode._from(data, self.proxy_url, self.api_key)
        episode._client = self
        return episode

    async def status(self, episode_id: str) -> dict[str, Any]:
        return _check(await self._call("GET", f"/v1/episodes/{episode_id}"))

    async def report(
        self,
        episode_id: str,
        success: bool,
        reward: float | None = None,
        success_turn: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body = _outcome_body(success, reward, success_turn, metadata)
        return _check(await self._call("POST", f"/v1/episodes/{episode_id}/outcome", body))

    async def end(self, episode_id: str) -> dict[str, Any]:
        return _check(await self._call("POST", f"/v1/episodes/{episode_id}/end"))

    async def metrics(self) -> str:
        """The proxy's ``/metrics`` page (Prometheus text format)."""
        response = await self._call("GET", "/metrics")
        if not response.is_success:
            _check(response)
        return str(response.text)

    async def aclose(self) -> None:
        if self._own:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncBudgetClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
