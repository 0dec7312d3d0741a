"""inspect-ai hooks that make every sample × epoch of an eval a budgetproxy episode.

inspect-ai loads this module through the `inspect_ai` entry point `budgetproxy`; with
BUDGETPROXY_URL set the hooks are on. For each sample attempt the episode is created on the
proxy (task id = the sample id, options from `budgetproxy_*` metadata keys), the sample's model
calls carry its id in `X-Episode-Id` (set on each call's generate config, which inspect builds
afresh per call; concurrent samples each see their own), a sample whose episode has spent its
budget is stopped as an inspect limit before a call the proxy would refuse, and its score is
reported as the episode's outcome. Model calls inspect makes outside a sample's generate (its
capability probe) and those made while scoring carry no episode id and spend no turn.
`pip install 'budgetproxy[inspect]'`.
"""

from __future__ import annotations

import contextvars
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from inspect_ai.hooks import (
    BeforeModelGenerate,
    Hooks,
    RunEnd,
    RunStart,
    SampleAttemptEnd,
    SampleAttemptStart,
    SampleEnd,
    SampleScoring,
    TaskStart,
    hooks,
)
from inspect_ai.scorer import value_to_float
from inspect_ai.util import LimitExceededError

from budgetproxy.client import AsyncBudgetClient, BudgetProxyError
from budgetproxy.integrations import inspect_rules as rules

__all__ = ["BudgetProxyHooks"]

log = logging.getLogger("budgetproxy.inspect")

EPISODE_HEADER = "X-Episode-Id"
# LimitExceededError's type for each axis a Stop names.
_LIMIT_TYPES: dict[str, Any] = {"turns": "turn", "tokens": "token", "cost": "cost",
                                "time": "time", "finished": "custom"}


@dataclass
class SampleEpisode:
    """One sample attempt's episode, as the hooks know it."""

    episode_id: str
    opts: dict[str, Any]
    gate: rules.CallGate | None = None
    error: str | None = None  # why no episode could be created
    scoring: bool = False
    ended: bool = False
    stops: list[rules.Stop] = field(default_factory=list)


# The episode of the sample whose code is running: set when an attempt starts, in the sample's
# own context, so concurrent samples each read theirs.
_current: contextvars.ContextVar[SampleEpisode | None] = contextvars.ContextVar(
    "budgetproxy_sample_episode", default=None)


@hooks(name="budgetproxy",
       description="Each sample x epoch is a budgetproxy episode (BUDGETPROXY_URL)")
class BudgetProxyHooks(Hooks):
    """The integration; inspect makes the one instance when it loads the entry point."""

    def __init__(self) -> None:
        self._client: AsyncBudgetClient | None = None
        self._task_meta: dict[str, dict[str, Any]] = {}  # by eval id: eval and task metadata
        self._task_errors: dict[str, str] = {}
        self._episodes: dict[str, SampleEpisode] = {}  # by inspect's sample uuid

    def enabled(self) -> bool:
        return rules.connection(os.environ) is not None

    # -- the run ------------------------------------------------------------------------------
    def _proxy(self) -> AsyncBudgetClient:
        if self._client is None:
            conn = rules.connection(os.environ)
            if conn is None:  # (enabled() said otherwise a moment ago)
                raise BudgetProxyError(f"{rules.URL_VAR} is not set")
            self._client = AsyncBudgetClient(conn.url, api_key=conn.api_key)
        return self._client

    async def on_run_start(self, data: RunStart) -> None:
        self._proxy()

    async def on_run_end(self, data: RunEnd) -> None:
        # Samples that never reached their end (a cancelled run) end without an outcome.
        for key, ep in list(self._episodes.items()):
            await self._end(ep)
            self._episodes.pop(key, None)
        self._task_meta.clear()
        self._task_errors.clear()
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def on_task_start(self, data: TaskStart) -> None:
        self._task_meta[data.eval_id] = dict(data.spec.metadata or {})
        try:
            rules.options(data.spec.metadata)
        except rules.OptionError as e:
            self._task_errors[data.eval_id] = str(e)
            log.error("budgetproxy: task %s: %s", data.spec.task, e)

    # -- a sample -----------------------------------------------------------------------------
    async def on_sample_attempt_start(self, data: SampleAttemptStart) -> None:
        summary = data.summary
        eid = rules.episode_id(data.eval_id, summary.id, summary.epoch, data.attempt)
        ep = SampleEpisode(eid, {})
        self._episodes[data.sample_id] = ep
        _current.set(ep)
        try:
            if data.eval_id in self._task_errors:
                raise rules.OptionError(self._task_errors[data.eval_id])
            ep.opts = rules.options(self._task_meta.get(data.eval_id), summary.metadata)
            created = await self._proxy().create_episode(
                episode_id=eid, task_id=rules.task_id(summary.id),
                tags={"inspect_eval_id": data.eval_id, "inspect_sample_id": str(summary.id),
                      "inspect_epoch": summary.epoch, "inspect_attempt": data.attempt},
                **{"group": data.eval_id, **rules.episode_fields(ep.opts)},
            )
        except (rules.OptionError, BudgetProxyError) as e:
            ep.error = f"budgetproxy could not start episode {eid}: {e}"
            log.error("%s", ep.error)
            return
        ep.gate = rules.CallGate.of(created.data)

    async def on_before_model_generate(self, data: BeforeModelGenerate) -> None:
        ep = _current.get()
        if ep is None or ep.scoring or ep.ended:
            return
        if ep.gate is None:  # a sample without its episode must not run uncounted
            raise LimitExceededError("custom", value=0, limit=0, message=ep.error)
        status = None
        if ep.gate.needs_status():
            try:
                status = await self._proxy().status(ep.episode_id)
            except BudgetProxyError as e:  # the call goes; the proxy decides
                log.warning("budgetproxy: could not read episode %s: %s", ep.episode_id, e)
        stop = ep.gate.admit(status)
        if stop is not None:
            ep.stops.append(stop)
            raise LimitExceededError(_LIMIT_TYPES.get(stop.axis, "custom"), value=stop.used,
                                     limit=stop.limit, message=stop.message)
        # inspect builds this config for this call alone (a deep copy per generate); a new
        # dict, so nothing it was copied from changes.
        data.config.extra_headers = {**(data.config.extra_headers or {}),
                                     EPISODE_HEADER: ep.episode_id}

    async def on_sample_scoring(self, data: SampleScoring) -> None:
        ep = self._episodes.get(data.sample_id)
        if ep is not None:
            ep.scoring = True  # a model-graded scorer's calls are not the agent's turns

    async def on_sample_attempt_end(self, data: SampleAttemptEnd) -> None:
        ep = self._episodes.get(data.sample_id)
        if ep is not None and data.will_retry:  # the next attempt is an episode of its own
            await self._end(ep)
            self._episodes.pop(data.sample_id, None)

    async def on_sample_end(self, data: SampleEnd) -> None:
        ep = self._episodes.pop(data.sample_id, None)
        if ep is None or ep.gate is None or ep.ended:
            return
        sample = data.sample
        to_float = value_to_float()
        values: dict[str, float | None] = {}
        for name, score in (sample.scores or {}).items():
            value = score.value
            values[name] = (None if isinstance(value, list | dict)
                            else float(to_float(value)))
        result = rules.outcome(values, ep.opts)
        if result is None:
            if values:
                log.warning("budgetproxy: the score of sample %s (epoch %s) is not a number; "
                            "episode %s ends without an outcome", sample.id, sample.epoch,
                            ep.episode_id)
            await self._end(ep)
            return
        meta: dict[str, Any] = {"scorer": result.scorer}
        if sample.limit is not None:
            meta["inspect_limit"] = sample.limit.type
        try:
            await self._proxy().report(ep.episode_id, result.success, reward=result.reward,
                                       metadata=meta)
            ep.ended = True
        except BudgetProxyError as e:
            log.warning("budgetproxy: could not report the outcome of episode %s: %s",
                        ep.episode_id, e)

    async def _end(self, ep: SampleEpisode) -> None:
        if ep.gate is None or ep.ended:
            return
        ep.ended = True
        try:
            await self._proxy().end(ep.episode_id)
        except BudgetProxyError as e:
            log.warning("budgetproxy: could not end episode %s: %s", ep.episode_id, e)
