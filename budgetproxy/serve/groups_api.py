"""The group API: declare a group's size, read its episodes, rewards and advantages, long-poll."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

import orjson
from fastapi import Body, FastAPI, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from budgetproxy.config import Config
from budgetproxy.core.episode import EpisodeState
from budgetproxy.core.keys import OPEN
from budgetproxy.core.rewards import advantages, final_reward
from budgetproxy.core.spec import PRINTABLE_PATTERN
from budgetproxy.core.tenants import local_id, tenant_for
from budgetproxy.errors import ProxyError
from budgetproxy.proxy.grouping import GROUP_SIZE_MAX, tenant_group
from budgetproxy.serve.episode_bodies import whole
from budgetproxy.store.base import EpisodeStore
from budgetproxy.store.groups import GroupKey, GroupStore

WAIT_MAX_S = 600.0
RECHECK_S = 5.0  # a long poll looks again at least this often (a wake-up it could miss)


class GroupCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task_id: str = Field(min_length=1, max_length=256, pattern=PRINTABLE_PATTERN)
    group: str = Field(min_length=1, max_length=256, pattern=PRINTABLE_PATTERN)
    size: Annotated[int, Field(ge=1, le=GROUP_SIZE_MAX, strict=True), BeforeValidator(whole)]


class GroupMember(BaseModel):
    """One episode of a group, as the group view shows it (the schema its answers follow)."""
    episode_id: str
    budget: int | None
    disclosure: str | None
    status: Literal["active", "finished"]
    end_reason: str | None
    reward: float | None
    advantage: float | None


class GroupView(BaseModel):
    task_id: str
    group: str
    size: int | None
    done: bool
    finished: int
    episodes: list[GroupMember]


_VIEW = {"model": GroupView}


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def request_tenant(request: Request) -> str | None:
    """The tenant namespace of the request's key (an admin key: the one it names)."""
    who = getattr(request.state, "principal", OPEN)
    try:
        return tenant_for(who, request.headers.get("x-episode-tenant", "").encode() or None)
    except ValueError as e:
        raise ProxyError(400, "invalid_request", str(e), param="tenant") from None


def member_view(episode_id: str, st: EpisodeState | None, config: Config) -> dict[str, Any]:
    episode_id = local_id(episode_id)  # the id its tenant's clients know
    if st is None:  # past retention: only its id is left
        return {"episode_id": episode_id, "budget": None, "disclosure": None,
                "status": "finished", "end_reason": None, "reward": None, "advantage": None}
    ended = st.status == "finished" and not st.end_pending
    return {
        "episode_id": episode_id,
        "budget": st.budget,
        "disclosure": st.disclosure,
        "status": "finished" if ended else "active",
        "end_reason": st.end_reason if ended else None,
        "reward": final_reward(st.reward, st.outcome, st.end_reason,
                               config.reward.on_exhausted) if ended else None,
        "advantage": None,
    }


async def group_view(key: GroupKey, groups: GroupStore, store: EpisodeStore,
                     config: Config) -> dict[str, Any] | None:
    """The group's episodes with their rewards after the rule, and, once it is done (its
    declared size of episodes ended; without a size, every member ended), their advantages."""
    size, ids = await groups.members(key)
    if size is None and not ids:
        return None
    states = await asyncio.gather(*(store.get(i) for i in ids))
    episodes = [member_view(i, st, config) for i, st in zip(ids, states, strict=True)]
    finished = sum(1 for e in episodes if e["status"] == "finished")
    active = len(episodes) - finished
    done = active == 0 and (finished >= size if size is not None else finished > 0)
    if done:
        for e, adv in zip(episodes, advantages([e["reward"] for e in episodes],
                                               scale_by_std=config.reward.scale_by_std),
                          strict=True):
            e["advantage"] = adv
    return {"task_id": key[0].rpartition("\0")[2], "group": key[1], "size": size,
            "done": done, "finished": finished, "episodes": episodes}


def add_group_routes(app: FastAPI, config: Config, store: EpisodeStore,
                     groups: GroupStore) -> None:
    # One look at a group at a time, shared by every request that wants it meanwhile: the
    # thousands of long polls a group's end wakes at once read the store once.
    looking: dict[GroupKey, asyncio.Future[dict[str, Any] | None]] = {}

    async def shared_view(key: GroupKey) -> dict[str, Any] | None:
        fut = looking.get(key)
        if fut is None:
            fut = looking[key] = asyncio.ensure_future(group_view(key, groups, store, config))
            fut.add_done_callback(lambda _: looking.pop(key, None))
        return await asyncio.shield(fut)

    @app.post("/v1/groups", status_code=201, responses={
        201: {**_VIEW, "description": "The group is declared: its view"},
        200: {**_VIEW, "description": "The group was already declared with this size (or its "
                                      "episodes named it first): its view"}})
    async def create_group(request: Request,
                           body: GroupCreate = Body()) -> Response:  # noqa: B008
        key = tenant_group(request_tenant(request), body.task_id, body.group)
        before, _ = await groups.members(key)
        size = await groups.declare(key, body.size)
        if size != body.size:
            raise ProxyError(409, "group_conflict",
                             f"Group {body.group!r} of task {body.task_id!r} has size {size}",
                             param="size")
        view = await group_view(key, groups, store, config)
        return _json(view, 201 if before is None else 200)

    @app.get("/v1/groups/{task_id}/{group}", responses={
        200: {**_VIEW, "description": "The group's view; with `wait`, once it is done or "
                                      "`timeout_s` has passed"}})
    async def get_group(request: Request, task_id: str, group: str, wait: bool = False,
                        timeout_s: float = Query(30.0, json_schema_extra={  # noqa: B008
                            "minimum": 0, "maximum": WAIT_MAX_S})) -> Response:
        if not 0 <= timeout_s <= WAIT_MAX_S:
            raise ProxyError(400, "invalid_request",
                             f"timeout_s must be between 0 and {WAIT_MAX_S:g}",
                             param="timeout_s")
        key = tenant_group(request_tenant(request), task_id, group)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            view = await shared_view(key)
            left = deadline - loop.time()
            if not wait or left <= 0 or (view is not None and view["done"]):
                break
            await groups.wait(key, min(left, RECHECK_S))
        if view is None:
            raise ProxyError(404, "group_not_found",
                             f"No group {group!r} of task {task_id!r}", param="group")
        return _json(view)
