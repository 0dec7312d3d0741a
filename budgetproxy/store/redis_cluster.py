"""The Redis store on Redis Cluster: the cluster client, and scripts sent one by one to the
node that owns their episode's slot (an episode's keys share one slot by their hash tag)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis import exceptions as rexc
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

# Errors a cluster answers while a slot moves or a master fails over: the store is
# unavailable for that call (503, or fail_open), never a proxy failure.
CLUSTER_UNAVAILABLE: tuple[type[BaseException], ...] = (
    rexc.ClusterDownError,
    rexc.ClusterError,
    rexc.MasterDownError,
    rexc.SlotNotCoveredError,
    rexc.RedisClusterException,
    rexc.MovedError,
    rexc.AskError,
)


# What redis-py's cluster client raises from a connection it is replacing while a master
# fails over (a closed transport, a writer already gone): that node is not answering.
CLUSTER_LOST: tuple[type[BaseException], ...] = (RuntimeError, AttributeError)


def as_unavailable(error: BaseException) -> BaseException:
    """`error` as the store reads it: a connection lost mid-failover as a ConnectionError
    (503, or fail_open), any other error as it is."""
    if isinstance(error, CLUSTER_LOST):
        lost = rexc.ConnectionError(f"a cluster connection was lost: {error!r}")
        lost.__cause__ = error
        return lost
    return error


def cluster_client(url: str, *, socket_timeout_s: float, connect_timeout_s: float,
                   max_connections: int) -> Any:
    """A cluster client for `url` (any node; the others are discovered). Commands are
    never retried on a connection error (a script whose reply was lost may have run);
    MOVED and ASK redirections are followed, which is routing, not a retry. At most
    `max_connections` per node: `eval_each` and `run_each` keep to it (the client itself
    fails a command past it instead of waiting)."""
    return RedisCluster.from_url(
        url,
        max_connections=max_connections,
        decode_responses=True,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=connect_timeout_s,
        retry=Retry(NoBackoff(), 0),
        protocol=2,
    )


async def eval_each(ops: Sequence[Any], slots: asyncio.Semaphore) -> list[Any]:
    """Run each script op (`.script`, `.keys`, `.args`) on its slot's node, concurrently,
    at most `slots` at a time (a burst waits for a connection rather than failing at the
    client's limit); replies or errors in order. redis-py's Script sends EVALSHA and loads
    the script on NOSCRIPT (a restarted or new master), as the single-node path does."""
    async def one(op: Any) -> Any:
        async with slots:
            return await op.script(keys=op.keys, args=op.args)

    results = await asyncio.gather(*(one(op) for op in ops), return_exceptions=True)
    return [as_unavailable(r) if isinstance(r, BaseException) else r for r in results]


async def run_each(client: Any, ops: Sequence[Any], is_eval: type,
                   slots: asyncio.Semaphore) -> list[Any]:
    """What a pipeline does on one node, on a cluster: each op in turn (scripts by
    `eval_each`, other commands as functions of a one-command pipeline), errors in place."""
    results: list[Any] = []
    for op in ops:
        try:
            if isinstance(op, is_eval):
                results.extend(await eval_each([op], slots))
            else:
                async with slots:
                    pipe = client.pipeline(transaction=False)
                    op(pipe)
                    results.extend(await pipe.execute(raise_on_error=False))
        except Exception as e:
            results.append(as_unavailable(e))
    return results
