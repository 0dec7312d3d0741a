"""GET /v1/episodes/{id}/trajectory: a finished episode's turns as the model saw them."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from budgetproxy.config import Config
from budgetproxy.core.rewards import final_reward
from budgetproxy.core.tenants import local_id
from budgetproxy.core.tokens import last_attempts, sequence
from budgetproxy.errors import ProxyError
from budgetproxy.proxy.wire import encode_exact, exact_payload
from budgetproxy.serve.episode_api import stored_id
from budgetproxy.store.base import EpisodeStore
from budgetproxy.store.turn_log import TurnLog, expand


def _entry(data: bytes) -> dict[str, Any]:
    """A kept turn's JSON, read keeping every integer exact: an entry whose messages carry
    an integer past 64 bits (a body the proxy sent exact, proxy/wire.py) is read again by
    the standard library, which orjson would turn into a float."""
    entry: dict[str, Any] = orjson.loads(data)
    exact, _ = exact_payload(data, entry)
    return entry if exact is None else exact


def _written(body: dict[str, Any]) -> bytes:
    """The trajectory's JSON. A turn's messages may hold what orjson does not write (an
    integer past 64 bits, nesting past 254 levels: kept turns written by the standard library,
    proxy/grouping.py); the standard library writes those, and a turn whose messages it
    cannot write either (nested deeper than its own limit, within the response) is given
    as truncated, without them."""
    try:
        return orjson.dumps(body)
    except TypeError:
        pass
    try:
        return encode_exact(body)
    except (RecursionError, ValueError):
        pass
    for turn in body["turns"]:
        try:
            encode_exact({"turns": [turn]})  # (at the depth it has in the response)
        except (RecursionError, ValueError):
            turn["messages"], turn["truncated"] = None, True
    return encode_exact(body)


def add_trajectory_route(app: FastAPI, config: Config, store: EpisodeStore,
                         turns: TurnLog | None) -> None:
    @app.get("/v1/episodes/{episode_id}/trajectory", responses={
        200: {"description": "The ended episode's turns, one per turn (its last answered "
                             "attempt), and its token sequence when the turns extend one another"}})
    async def trajectory(request: Request, episode_id: str) -> Response:
        named = episode_id
        episode_id = stored_id(request, episode_id)  # in the key's tenant namespace
        st = await store.get(episode_id)
        if st is None:
            if await store.is_known(episode_id):
                raise ProxyError(404, "trajectory_not_found",
                                 f"Episode {named!r} is past retention; its turns are "
                                 "only in the trajectory log", param="episode_id")
            raise ProxyError(404, "episode_not_found", f"No episode with id {named!r}",
                             param="episode_id")
        if st.status != "finished" or st.end_pending:
            raise ProxyError(409, "episode_active",
                             f"Episode {named!r} has not ended; its trajectory is served "
                             "once it has (report its outcome or end it)", param="episode_id")
        if turns is None:
            raise ProxyError(404, "trajectory_not_found",
                             "This proxy keeps no trajectories (rollouts.keep_turns: false)",
                             param="episode_id")
        raw = await turns.read(episode_id) or []
        kept = last_attempts(expand([_entry(b) for b in raw]))
        seq = sequence(kept)
        body: dict[str, Any] = {
            "episode_id": local_id(st.episode_id),
            "task_id": st.task_id,
            "group": st.group,
            "budget": st.budget,
            "disclosure": st.disclosure,
            "end_reason": st.end_reason,
            "reward": final_reward(st.reward, st.outcome, st.end_reason,
                                   config.reward.on_exhausted),
            # every turn's prompt ids extend the previous prompt and completion: the episode
            # is one token sequence (token_ids, with loss_mask 1 on sampled tokens); None
            # when no token ids were captured
            "append_only": (seq is not None) if any(
                t.get("prompt_token_ids") is not None for t in kept) else None,
            "turns": kept,
        }
        if seq is not None:
            body["token_ids"] = seq.token_ids
            body["loss_mask"] = seq.loss_mask
        return Response(_written(body), media_type="application/json")
