"""Redis episode store: replicas share budgets; every state change is one Lua script.

Key layout (the id sits in braces, a Redis Cluster hash tag, so an episode's keys share a slot):

- ``{prefix}:ep:{<id>}`` — the episode, a hash of strings (`redis_codec.py`). Active episodes expire
  after 2 × idle timeout + retention without activity, a backstop for when no replica sweeps;
  finished ones expire after retention.
- ``{prefix}:gone:{<id>}`` — the remembered id of a finished episode, kept for retention +
  ``remember_s``, so later calls get ``episode_finished`` and the id cannot be reused.
- ``{prefix}:pl:{<id>}`` — the episode's disclosure placements (history: keep), a list of JSON
  texts in the order placed, beside the hash so that a turn reads and writes only its end
  (open_turn.lua); it expires with the episode and goes when the episode ends.
- ``{prefix}:active`` — sorted set of active episode ids scored by a lower bound of their last
  activity (the creation time, raised lazily by the sweep), so turns never write it.

BudgetMix budgets and mixed arms are drawn from (seed, task_id, group) in `core.budget`, so
replicas with the same config agree without storing them.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from typing import Any, TypeVar

import orjson

try:
    import hiredis
    import redis.asyncio as aioredis
    from redis import exceptions as rexc
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError(
        "the Redis episode store needs the redis and hiredis packages: "
        "pip install 'budgetproxy[redis]'"
    ) from e

from budgetproxy.core.axes import OUTPUT_HOLD, AxisGrant, Spend, cumulative
from budgetproxy.core.episode import (
    NO_PLACEMENTS,
    EpisodeState,
    FinishStatus,
    Grant,
    GrantKind,
    Known,
    OutcomeReport,
    Placements,
    SettleResult,
    as_placed,
    finish,
    place,
    placed,
)
from budgetproxy.store.base import (
    FinishOutcome,
    StoreBusy,
    StoreUnavailable,
    TurnClose,
    TurnOpen,
)
from budgetproxy.store.redis_cluster import (
    CLUSTER_LOST,
    CLUSTER_UNAVAILABLE,
    as_unavailable,
    cluster_client,
    eval_each,
    run_each,
)
from budgetproxy.store.redis_codec import decode_state, encode_state
from budgetproxy.store.redis_pipe import Pending, ScriptPipe, resolve

__all__ = ["RedisStore", "decode_state", "encode_state"]

T = TypeVar("T")

# Errors that mean "Redis is not answering" (down, restarting, loading, failed over).
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    rexc.ConnectionError,
    rexc.TimeoutError,
    rexc.ReadOnlyError,
    rexc.TryAgainError,
    OSError,
    TimeoutError,
    *CLUSTER_UNAVAILABLE,
)
_SWEEP_BATCH = 256
# Connections to Redis (per node on a cluster) besides the turns' pipelined one; a burst past
# it waits for one to come free.
MAX_CONNECTIONS = 64
# Active turn-only episodes whose fixed fields this process keeps (RedisStore._fixed), so
# their turns' replies carry only what a turn changes (~1 KB each); an episode leaves when
# it ends through this process, or, oldest first, when more would be kept.
_FIXED_MAX = 4096
# open_turn.lua's ARGV[12] (its args from 0 here): '1' when this process keeps the episode's
# fixed fields, so a forwarded turn is answered with what it changed.
_KNOWS_FIXED = 11

class _Eval:
    """One script call inside a pipeline (a plain class: one is made per call)."""

    __slots__ = ("script", "keys", "args")

    def __init__(self, script: Any, keys: list[str], args: list[Any]) -> None:
        self.script = script
        self.keys = keys
        self.args = args


def _remembered_state(episode_id: str) -> EpisodeState:
    """What is left of a finished episode past retention: its id."""
    return EpisodeState(episode_id=episode_id, budget=0, max_turns=None, disclosure="hidden",
                        status="finished")


@contextmanager
def _store_errors() -> Iterator[None]:
    try:
        yield
    except rexc.MovedError as e:  # a cluster node, reached without the cluster client
        raise StoreUnavailable(f"Redis is a cluster node ({e}): set store.cluster: true") from e
    except _UNAVAILABLE as e:
        if isinstance(e, rexc.ConnectionError) and isinstance(e.__cause__, TimeoutError):
            # (redis-py's pool: no connection came free within its timeout)
            raise StoreBusy(f"every connection to Redis stayed busy: {e}") from e
        raise StoreUnavailable(f"Redis is unavailable: {e}") from e


class RedisStore:
    """Episode state in Redis, shared by every replica and worker pointing at the same URL.

    Commands are never retried by the client: a state-changing script whose reply was lost may
    have run, so the caller gets StoreUnavailable (503 or fail_open) instead of a double charge.
    Connections that died with a Redis restart are replaced before their next use, and scripts
    the restarted server lacks are loaded again on NOSCRIPT: the proxy recovers by itself.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "budgetproxy",
        idle_timeout_s: float = 3600.0,
        retention_s: float = 86400.0,
        remember_s: float = 30 * 86400.0,
        sweep_interval_s: float = 5.0,
        socket_timeout_s: float = 5.0,
        connect_timeout_s: float = 2.0,
        cluster: bool = False,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        if not prefix or "{" in prefix or "}" in prefix:
            raise ValueError("store.key_prefix: must be non-empty, without '{' or '}'")
        self.prefix = prefix
        self._active_key = f"{prefix}:active"
        # An active episode's key outlives the sweep's claim of it (at twice the idle timeout,
        # on the sweep after: expire.lua) by an idle timeout and a sweep whatever the retention,
        # so a call in flight that long still ends it with its record and tombstone.
        self._active_ttl_ms = _ms(3 * idle_timeout_s + sweep_interval_s + retention_s)
        self._retention_ms = _ms(retention_s)
        self._remember_ms = _ms(remember_s)
        self._socket_timeout_s = socket_timeout_s
        self._clock_offset_ms: float | None = None  # Redis's clock minus ours (_measure_clock)
        self._cluster = cluster
        self._cluster_ready = False
        self._cluster_lock = asyncio.Lock()
        self._cluster_slots = asyncio.Semaphore(max_connections)  # (cluster commands)
        if cluster:  # redis_cluster.py: the same scripts, routed to their slot's node
            self._redis: Any = cluster_client(url, socket_timeout_s=socket_timeout_s,
                                              connect_timeout_s=connect_timeout_s,
                                              max_connections=max_connections)
        else:
            # A burst waits for a pooled connection (up to the socket timeout) instead of
            # failing at the pool's limit: only Redis itself not answering is "unavailable".
            pool = aioredis.BlockingConnectionPool.from_url(
                url,
                max_connections=max_connections,
                timeout=socket_timeout_s,
                decode_responses=True,
                socket_timeout=socket_timeout_s,
                socket_connect_timeout=connect_timeout_s,
                retry=Retry(NoBackoff(), 0),
                # RESP2: under RESP3 redis-py skips its check for pooled connections that the
                # server closed, and the first command after a Redis restart would fail.
                protocol=2,
            )
            self._redis = aioredis.Redis(connection_pool=pool)
        self._fixed: dict[str, EpisodeState] = {}  # by episode id: see _FIXED_MAX
        self._queue: list[Pending] = []  # a cluster's scripts of this iteration
        self._closed = False
        self._sending: set[asyncio.Future[None]] = set()
        self._pipe = ScriptPipe(self._redis, _pack_evalsha, socket_timeout_s)  # single node
        prelude = _lua("episode.lua")
        turns = prelude + _lua("axes.lua")
        self._open = self._redis.register_script(turns + _lua("open_turn.lua"))
        self._close = self._redis.register_script(turns + _lua("close_turn.lua"))
        self._create = self._redis.register_script(prelude + _lua("create.lua"))
        self._finish = self._redis.register_script(prelude + _lua("finish.lua"))
        self._expire = self._redis.register_script(prelude + _lua("expire.lua"))
        self._keep_told = self._redis.register_script(_KEEP_TOLD)
        self._read = self._redis.register_script(_READ)
        self._finish_reply = self._redis.register_script(_FINISH_REPLY)
        self._index = self._redis.register_script(_INDEX)

    # -- keys ----------------------------------------------------------------------------------
    def episode_key(self, episode_id: str) -> str:
        return f"{self.prefix}:ep:{{{episode_id}}}"

    def remembered_key(self, episode_id: str) -> str:
        return f"{self.prefix}:gone:{{{episode_id}}}"

    def placements_key(self, episode_id: str) -> str:
        return f"{self.prefix}:pl:{{{episode_id}}}"

    def _deadline_ms(self) -> str:
        """When a turn's reserve sent now is past its caller's wait (its socket timeout), in
        Redis's clock: the script refuses to reserve after it ('' before the clock is read)."""
        offset = self._clock_offset_ms
        if offset is None:
            return ""
        return str(int(time.time() * 1000 + offset + self._socket_timeout_s * 1000))

    async def _measure_clock(self) -> None:
        """How far Redis's clock is from this process's (read by each sweep), for deadlines."""
        before = time.time()
        seconds, micros = await self._call(lambda: self._redis.time())
        after = time.time()
        self._clock_offset_ms = (int(seconds) * 1000 + int(micros) / 1000
                                 - (before + after) * 500)

    def _keys(self, episode_id: str) -> list[str]:
        return [self.episode_key(episode_id), self.remembered_key(episode_id),
                self.placements_key(episode_id)]

    async def _call(self, op: Callable[[], Awaitable[T]]) -> T:
        with _store_errors():
            if self._cluster:
                try:
                    await self._discover()
                    async with self._cluster_slots:
                        return await op()
                except CLUSTER_LOST as e:
                    raise as_unavailable(e) from e
            return await op()

    async def _discover(self) -> None:
        """Learn the cluster's slots once, before the first command: commands racing the
        client's own first discovery fail on connections it is still replacing."""
        if self._cluster_ready:
            return
        async with self._cluster_lock:
            if not self._cluster_ready:
                await self._redis.initialize()
                self._cluster_ready = True

    async def _pipeline(self, ops: Sequence[_Eval | Callable[[Any], Any]]) -> list[Any]:
        """Run commands in one round trip (not a transaction); raise the first error."""
        results = await self._execute(ops)
        for r in results:
            if isinstance(r, Exception):
                with _store_errors():
                    raise r
        return results

    async def _execute(self, ops: Sequence[_Eval | Callable[[Any], Any]]) -> list[Any]:
        """One pipeline; per-command errors come back in place. Scripts go by EVALSHA.

        A script the server lacks (NOSCRIPT after a restart) is loaded and run again on its
        own; a script that did run is never run twice.
        """
        if self._cluster:
            with _store_errors():
                await self._discover()
                return await run_each(self._redis, ops, _Eval, self._cluster_slots)
        with _store_errors():
            pipe = self._redis.pipeline(transaction=False)
            for op in ops:
                if isinstance(op, _Eval):
                    pipe.evalsha(op.script.sha, len(op.keys), *op.keys, *op.args)
                else:
                    op(pipe)
            results: list[Any] = await pipe.execute(raise_on_error=False)
            for i, (op, r) in enumerate(zip(ops, results, strict=True)):
                if isinstance(op, _Eval) and isinstance(r, rexc.NoScriptError):
                    try:
                        results[i] = await op.script(keys=op.keys, args=op.args)
                    except rexc.ResponseError as e:
                        results[i] = e
        return results

    def register(self, source: str) -> Any:
        """A Lua script for `submit` and `run` (sent by EVALSHA, loaded again on NOSCRIPT)."""
        return self._redis.register_script(source)

    def submit(self, script: Any, keys: list[str], args: list[Any],
               convert: Callable[[Any], Any] | None = None) -> asyncio.Future[Any]:
        """Send `script` with the others issued in this event-loop iteration; the future gets
        its reply, or the exception (as its result, not raised) when it failed.

        Each script stays its own atomic step; batching the calls of concurrent requests into
        one write saves the client's per-command cost, which dominates at high concurrency.
        On a single node scripts run in the order submitted (one pipelined connection,
        redis_pipe.py); on a cluster, those of one iteration run concurrently. With `convert`, the
        future gets `convert(reply)` instead, or the exception it raises (given the error).
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        if self._closed:
            resolve(fut, convert, StoreUnavailable("the Redis store was closed"))
            return fut
        if not self._cluster:
            self._pipe.submit(_Eval(script, keys, args), fut, convert)
            return fut
        self._queue.append((_Eval(script, keys, args), fut, convert))
        if len(self._queue) == 1:
            loop.call_soon(self._flush)
        return fut

    async def run(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        """`submit`, awaited: the reply, or StoreUnavailable."""
        return _raised(await self.submit(script, keys, args))

    async def _eval(self, op: _Eval) -> Any:
        return _raised(await self.submit(op.script, op.keys, op.args))

    def _flush(self) -> None:
        """A cluster's batch: each script to its slot's node (redis_cluster.eval_each)."""
        if not self._queue:  # flushed already (close)
            return
        batch, self._queue = self._queue, []
        task = asyncio.ensure_future(self._send(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[Pending]) -> None:
        try:
            try:
                async with asyncio.timeout(self._socket_timeout_s):
                    await self._discover()
                    results = await eval_each([op for op, _, _ in batch], self._cluster_slots)
            except Exception as e:  # the whole batch failed (connection lost): all see it
                results = [e] * len(batch)
            for (_, fut, convert), r in zip(batch, results, strict=True):
                resolve(fut, convert, r)
        finally:
            for _, fut, _ in batch:  # cancelled mid-batch (shutdown): nobody is left waiting
                if not fut.done():
                    fut.set_exception(StoreUnavailable("the Redis store was closed"))

    # -- turns ---------------------------------------------------------------------------------
    async def open_turn(
        self,
        episode_id: str,
        fresh: Callable[[], EpisodeState],
        body_hash: str,
        now: float,
        *,
        free_retries: int,
        message_count: int,
        disclosure_index: int | None,
        model: str | None = None,
        fingerprint: str | None = None,
        client_cap: int | None = None,
        out_rate: float | None = None,
        output_hold: int = OUTPUT_HOLD,
        placements_known: Known | None = None,
    ) -> TurnOpen:
        keys = self._keys(episode_id)
        fixed = self._fixed.get(episode_id)
        args: list[Any] = [
            body_hash, repr(float(now)), free_retries, message_count,
            "" if disclosure_index is None else disclosure_index, self._active_ttl_ms,
            model or "", fingerprint or "", "" if client_cap is None else client_cap,
            "" if out_rate is None else repr(float(out_rate)), output_hold,
            "" if fixed is None else "1",
            "" if placements_known is None else placements_known.size,
            "" if placements_known is None else placements_known.digest,
            self._deadline_ms(),
        ]
        reply = _in_time(await self._eval(_Eval(self._open, keys, args)))
        if fixed is not None and reply[0] == "forward" and reply[2] is False:
            # what the turn changed (open_turn.lua)
            return _forward(episode_id, body_hash, reply, _slim_state(
                fixed, reply, now, message_count, fingerprint), False, placements_known)
        if reply[0] == "absent":
            st = fresh()  # may raise (bad headers): then nothing is stored
            # The episode is gone from Redis (lost with a restart, or never there): what this
            # process kept of it is stale, and the reply must be whole whoever creates it (a
            # call racing this one may, and the script then opens its turn as a later one).
            self._fixed.pop(episode_id, None)
            args[_KNOWS_FIXED] = ""
            create = [*args, *encode_state(st)]
            score = st.last_activity or now

            # Indexed (for the sweep of idle episodes) in the same write as its creation,
            # on the pipelined connection: once per episode, not through redis-py's pipeline
            # (~5,000 opcodes, a tenth of a 10-turn episode's extra cost per call).
            indexed = self.submit(self._index, [self._active_key], [repr(float(score)),
                                                                   episode_id])
            reply = _in_time(await self._eval(_Eval(self._open, keys, create)))
            _raised(await indexed)
        opened = _turn_open(episode_id, body_hash, reply, placements_known)
        st = opened.state
        if (opened.grant.kind is GrantKind.FORWARD and st.status == "active"
                and st.token_budget is None and st.cost_budget is None
                and st.time_budget_s is None):
            # Its fixed fields, for the next turns' short replies; at most _FIXED_MAX
            # episodes, the oldest dropped first (one dropped gets a full reply again).
            if len(self._fixed) >= _FIXED_MAX:
                del self._fixed[next(iter(self._fixed))]
            self._fixed[episode_id] = st
        elif fixed is not None:  # refused or ended: full replies from here on
            self._fixed.pop(episode_id, None)  # (a concurrent call may have dropped it)
        return opened

    def close_turn(
        self, episode_id: str, grant: Grant, result: SettleResult, now: float, *,
        count_failed: bool, spend: Spend | None = None, timed_out: bool = False,
    ) -> asyncio.Future[TurnClose]:
        """Sent at once, with the scripts of this event-loop iteration (a turn log's append
        issued before the caller awaits rides in the same write); the future has the reply."""
        args = [
            grant.turn, 1 if grant.charged else 0, grant.body_hash, str(result),
            repr(float(now)), 1 if count_failed else 0, self._active_ttl_ms, self._retention_ms,
        ]
        keys = [self.episode_key(episode_id), self.placements_key(episode_id)]
        if grant.hold is None:
            return self.submit(self._close, keys, args, _turn_close)
        args += _settle_args(grant.hold, spend, timed_out)
        return self.submit(self._close, keys, args, lambda raw: _turn_close(raw, now))

    async def keep_told(self, episode_id: str, turn: int, text: str) -> None:
        keys = [self.episode_key(episode_id)]
        await self._eval(_Eval(self._keep_told, keys, [f"told:{turn}", text]))

    async def finish_reply(self, episode_id: str, limit: int) -> bool:
        keys = [self.episode_key(episode_id)]
        return bool(await self._eval(_Eval(self._finish_reply, keys, [limit])))

    # -- episodes ------------------------------------------------------------------------------
    async def create(self, fresh: EpisodeState) -> bool:
        eid = fresh.episode_id
        keys = self._keys(eid)
        args = [self._active_ttl_ms, *encode_state(fresh)]
        score = fresh.last_activity or fresh.created_at

        created = (await self._pipeline([
            lambda pipe: pipe.zadd(self._active_key, {eid: score}, nx=True),
            _Eval(self._create, keys, args),
        ]))[1]
        return bool(created)

    async def get(self, episode_id: str) -> EpisodeState | None:
        keys = [self.episode_key(episode_id), self.placements_key(episode_id)]
        pairs, listed = await self._eval(_Eval(self._read, keys, []))
        if not pairs:
            return None
        st = decode_state([_text(x) for x in pairs])
        # the list, then any placements still in the hash (an older version's), as the
        # episode's next turn puts them there (open_turn.lua)
        entries = [orjson.loads(p) for p in listed]
        for p in st.disclosed_at:
            if len(p) == 4:
                place(entries, p)
        st.disclosed_at = entries
        return st

    async def is_known(self, episode_id: str) -> bool:
        keys = self._keys(episode_id)
        n: int = await self._call(lambda: self._redis.exists(*keys))
        return n > 0

    async def finish(
        self, episode_id: str, report: OutcomeReport | None, now: float
    ) -> FinishOutcome:
        keys = self._keys(episode_id)
        if report is None:
            args: list[Any] = [repr(float(now)), 0, 0, "", "", b"{}"]
        else:
            args = [
                repr(float(now)), 1, 1 if report.success else 0,
                b"" if report.reward is None else orjson.dumps(report.reward),
                "" if report.success_turn is None else int(report.success_turn),
                orjson.dumps(report.metadata),
            ]
        args += [self._retention_ms, self._remember_ms, self._active_ttl_ms]
        self._fixed.pop(episode_id, None)  # its turns from here on are refused, answered whole
        raw = (await self._pipeline([
            _Eval(self._finish, keys, args),
            lambda pipe: pipe.zrem(self._active_key, episode_id),
        ]))[0]
        if raw is None:
            return FinishOutcome(None, None)
        reply = _json(raw)
        st = decode_state(reply[1])
        if reply[0] == "finished":
            if st.end_pending:
                # Its turns in flight record it when they settle; back in the idle index
                # meanwhile, so a sweep records it if the replica serving them dies.
                score = st.last_activity
                try:
                    await self._call(
                        lambda: self._redis.zadd(self._active_key, {episode_id: score}))
                except StoreUnavailable:  # the episode did end; only that safety net is lost
                    pass
            return FinishOutcome(FinishStatus.FINISHED, st)
        # Already ended: the core compares the report with the stored one, changing nothing.
        return FinishOutcome(finish(st, report, now), st)

    async def expire_idle(
        self, now: float, idle_timeout_s: float, retention_s: float
    ) -> list[EpisodeState]:
        """End idle episodes. Each is claimed in one script, so one replica ends (and logs) it.

        Finished episodes need no sweep: Redis expires them after retention.
        """
        await self._measure_clock()
        cutoff = now - idle_timeout_s
        args = [repr(float(now)), repr(float(idle_timeout_s)), _ms(retention_s),
                self._remember_ms]
        ended: list[EpisodeState] = []
        while True:
            ids: list[str] = await self._call(
                lambda: self._redis.zrangebyscore(
                    self._active_key, "-inf", cutoff, start=0, num=_SWEEP_BATCH
                )
            )
            if not ids:
                break

            replies = await self._pipeline(
                [_Eval(self._expire, self._keys(eid), args) for eid in ids]
            )
            drop: list[str] = []
            rescore: dict[str, float] = {}
            for eid, raw in zip(ids, replies, strict=True):
                reply = _json(raw)
                kind = reply[0]
                if kind == "claimed":
                    ended.append(decode_state(reply[1]))
                    drop.append(eid)
                    self._fixed.pop(eid, None)
                elif kind in ("missing", "ended"):
                    drop.append(eid)
                elif kind == "fresh":
                    rescore[eid] = float(reply[1])
                else:  # busy: a turn in flight; look again when it can be claimed anyway
                    rescore[eid] = float(reply[1]) + idle_timeout_s

            await self._tidy_active(drop, rescore)
            if len(ids) < _SWEEP_BATCH:
                break
        return ended

    async def _tidy_active(self, drop: list[str], rescore: dict[str, float]) -> None:
        """Drop ended episodes from the idle index; raise the scores of those still in use."""
        ops: list[Callable[[Any], Any]] = []
        if drop:
            ops.append(lambda pipe: pipe.zrem(self._active_key, *drop))
        if rescore:
            # XX: an episode ended meanwhile by another replica is not put back.
            ops.append(lambda pipe: pipe.zadd(self._active_key, rescore, xx=True))
        if ops:
            await self._pipeline(ops)

    async def finish_all_active(self, now: float) -> list[EpisodeState]:
        """Nothing: the active episodes are shared with the other replicas.

        One replica stopping (a rolling deploy, a scale-in) must not end episodes the others
        are serving; an episode nobody talks to any more ends by the idle sweep of whichever
        replica claims it first, and is logged there as abandoned.
        """
        return []

    async def active_count(self) -> int:
        n: int = await self._call(lambda: self._redis.zcard(self._active_key))
        return n

    async def ping(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except (rexc.RedisError, OSError):
            return False

    async def close(self) -> None:
        # What was submitted goes out and is answered; nothing submitted is dropped.
        self._flush()
        while self._sending:  # (replies may submit more: a turn log's swap)
            await asyncio.gather(*self._sending, return_exceptions=True)
            await asyncio.sleep(0)
            self._flush()
        await self._pipe.drain()
        self._closed = True
        self._pipe.close()
        await self._redis.aclose()


# An episode and its placements, read together (the hash's field/value pairs, the list).
_READ = """
return {redis.call('HGETALL', KEYS[1]), redis.call('LRANGE', KEYS[2], 0, -1)}
"""


# ZADD NX as a script: it goes with the scripts of its event-loop iteration (`submit`).
_INDEX = """
return redis.call('ZADD', KEYS[1], 'NX', ARGV[1], ARGV[2])
"""


# EpisodeState.told: one hash field per turn, on an active episode only (never a stub hash).
_KEEP_TOLD = """
if redis.call('HGET', KEYS[1], 'status') == 'active' then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
return 1
"""


# A field of the episode's hash that no EpisodeState field reads (decode_state passes it over):
# finish mode's final replies given, counted only on that path.
_FINISH_REPLY = """
if redis.call('HGET', KEYS[1], 'status') ~= 'active' then
  return 0
end
local given = tonumber(redis.call('HGET', KEYS[1], 'finish_replies') or '0')
if given >= tonumber(ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 'finish_replies', given + 1)
return 1
"""


def _raised(result: Any) -> Any:
    """A batched script's reply, or its error raised (as StoreUnavailable when Redis is down)."""
    if isinstance(result, Exception):
        with _store_errors():
            raise result
    return result


def _in_time(raw: Any) -> list[Any]:
    """open_turn.lua's reply; StoreUnavailable when it ran past the call's deadline (its
    caller had already answered 503, and it reserved nothing)."""
    reply = _json(raw)
    if reply[0] == "late":
        raise StoreUnavailable("Redis ran the turn's reserve past the call's deadline")
    return reply


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


def _lua(name: str) -> str:
    return resources.files("budgetproxy.store").joinpath(name).read_text(encoding="utf-8")


def _pack_evalsha(op: _Eval) -> bytes:
    """EVALSHA sha numkeys keys... args... in the Redis protocol (RESP), packed by hiredis.
    Floats are passed as their repr (strings), which round-trips them."""
    packed: bytes = _pack(("EVALSHA", op.script.sha, len(op.keys), *op.keys, *op.args))
    return packed


def _pack_in_python(command: tuple[Any, ...]) -> bytes:
    """hiredis.pack_command for hiredis releases before 2.1."""
    raw = [a if type(a) is bytes else str(a).encode() for a in command]
    return b"*%d\r\n" % len(raw) + b"".join([b"$%d\r\n%s\r\n" % (len(a), a) for a in raw])


_pack: Callable[[tuple[Any, ...]], bytes] = getattr(hiredis, "pack_command", _pack_in_python)


def _text(raw: str | bytes) -> str:
    """A value of a script's reply (bytes on the pipelined connection, str on a cluster)."""
    return raw.decode() if type(raw) is bytes else str(raw)


def _json(raw: str | bytes) -> list[Any]:
    reply: list[Any] = orjson.loads(raw)
    return reply


def _turn_close(raw: Any, now: float | None = None) -> TurnClose:
    """close_turn.lua's reply: nil (unknown episode), the refund alone (a turn-only call
    that did not end its episode), or [refunded, snapshot, ended] (`now`: the settle's time,
    for a call holding other axes, whose spend the snapshot gives)."""
    if type(raw) is int:
        return TurnClose(raw == 1, None)
    if raw is None:
        return TurnClose(False, None)
    reply = _json(_raised(raw))
    st = decode_state(reply[1])
    ended = bool(reply[2])
    return TurnClose(bool(reply[0]), st if ended else None, ended,
                     None if now is None else cumulative(st, now))


def _turn_open(episode_id: str, body_hash: str, reply: list[Any],
               known: Known | None = None) -> TurnOpen:
    kind = reply[0]
    if kind == "gone":
        return TurnOpen(Grant(GrantKind.FINISHED), _remembered_state(episode_id), False)
    created = bool(reply[1])
    st = decode_state(reply[2])
    if kind == "finished":
        return TurnOpen(Grant(GrantKind.FINISHED, turn=st.last_turn), st, created)
    if kind == "exhausted":
        return TurnOpen(Grant(GrantKind.EXHAUSTED, turn=st.turns_used), st, created)
    if kind == "need_price":
        return TurnOpen(Grant(GrantKind.NEED_PRICE), st, created)
    if kind == "held":
        return TurnOpen(Grant(GrantKind.HELD, turn=st.turns_used), st, created)
    return _forward(episode_id, body_hash, reply, st, created, known)


def _slim_state(fixed: EpisodeState, reply: list[Any], now: float, message_count: int,
                fingerprint: str | None) -> EpisodeState:
    """The episode after a forwarded turn, from its fixed fields (an earlier full reply of
    this active turn-only episode) and the turn's changes in a short reply: what the script
    wrote, field by field (open_turn.lua); the rest of an active episode never changes."""
    used, inflight, free_used, last_hash, model, refused = reply[10]
    st = fixed.snapshot()
    st.__dict__.update(
        turns_used=used, inflight=inflight, last_turn=reply[3], last_attempt=reply[4],
        last_hash=last_hash, last_state="inflight", last_charged=reply[5] == 1,
        free_retries_used=free_used, refused=refused == "1",
        disclosed_at=[], messages_seen=message_count,
        messages_digest=fingerprint or None, last_activity=now, model=model or None,
    )
    return st


def _placements(prior: list[Any], known: Known | None) -> Placements:
    """open_turn.lua's earlier placements: [how many, the newest (JSON), all (JSON) or false
    when they were as `known` told]."""
    count, newest, every = prior
    if not count:
        return NO_PLACEMENTS
    last = as_placed(orjson.loads(newest))
    if every is False and known is not None:
        return Placements(count, last, None, known)
    return Placements(count, last, placed(orjson.loads(every)))


def _forward(episode_id: str, body_hash: str, reply: list[Any], st: EpisodeState,
             created: bool, known: Known | None) -> TurnOpen:
    grant = Grant(
        GrantKind.FORWARD,
        turn=int(reply[3]),
        attempt=int(reply[4]),
        charged=bool(reply[5]),
        body_hash=body_hash,
        disclosed_at=_placements(reply[6], known),
        messages_seen=int(reply[7]),
        messages_digest=reply[8] or None,
        hold=_hold(reply[9]) if len(reply) > 9 and reply[9] else None,
    )
    return TurnOpen(grant, st, created)


def _hold(raw: str) -> AxisGrant:
    cap, tokens, cost, deadline = orjson.loads(raw)
    return AxisGrant(cap=cap, tokens=int(tokens), cost=float(cost),
                     deadline=None if deadline is None else float(deadline))


def _settle_args(hold: AxisGrant, spend: Spend | None, timed_out: bool) -> list[Any]:
    """close_turn.lua's axes_settle arguments (core.axes.settle)."""
    return [hold.tokens, repr(float(hold.cost)), "" if spend is None else spend.tokens,
            "" if spend is None or spend.cost is None else repr(float(spend.cost)),
            1 if timed_out else 0]
