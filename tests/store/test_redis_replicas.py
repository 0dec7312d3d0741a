"""Replicas on one Redis: real `budgetproxy serve` processes driven by the official client."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from redis_support import (
    REDIS_URL,
    ProxyProcess,
    drop_prefix,
    metric_total,
    new_prefix,
    require_redis,
    write_config,
)

from budgetproxy.config import TrajectoriesConfig
from budgetproxy.testing.fake_upstream import FakeUpstream

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstream]:
    up = FakeUpstream().start()
    yield up
    up.stop()


@pytest.fixture(scope="module")
def prefix() -> Iterator[str]:
    require_redis()
    p = new_prefix()
    yield p
    drop_prefix(p)


def replica_config(directory: Path, name: str, upstream: FakeUpstream, prefix: str,
                   **sections: Any) -> Path:
    episodes = {"sweep_interval_s": 0.5, **sections.pop("episodes", {})}
    return write_config(
        directory / f"{name}.yaml", upstream.base_url,
        store={"kind": "redis", "url": REDIS_URL, "key_prefix": prefix},
        trajectories={"dir": str(directory / f"traj-{name}")},
        episodes=episodes, **sections,
    )


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory, fake: FakeUpstream, prefix: str
) -> Iterator[list[ProxyProcess]]:
    d = tmp_path_factory.mktemp("replicas")
    procs = [ProxyProcess(replica_config(d, n, fake, prefix), d / f"{n}.log") for n in "ab"]
    try:
        for p in procs:
            p.start()
        yield procs
    finally:
        for p in procs:
            p.stop()


def reached(upstream: FakeUpstream, marker: str) -> int:
    """Chat calls the upstream received whose body carries `marker`."""
    with upstream._lock:
        return sum(1 for r in upstream.requests if marker.encode() in r.body)


def records(directory: Path, kind: str, episode_id: str) -> list[dict[str, Any]]:
    out = []
    for path in directory.glob("traj-*/*.jsonl"):
        for line in path.read_text().split("\n")[:-1]:  # not a line still being written
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec.get("type") == kind and rec.get("episode_id") == episode_id:
                out.append(rec)
    return out


async def race(urls: list[str], eid: str, calls: int, budget: int, tag: str = "") -> list[int]:
    """`calls` concurrent turns of one episode spread over the replicas; their statuses.
    Bodies differ by `tag` between races: a body identical to the episode's last turn would be
    a free retry of that turn, not a new one."""
    clients = [openai.AsyncOpenAI(base_url=u, api_key="sk-test", max_retries=0, timeout=30)
               for u in urls]

    async def one(i: int) -> int:
        client = clients[i % len(clients)]
        try:
            await client.chat.completions.create(
                model="fake-model",
                messages=[{"role": "user", "content": f"{eid} {tag} call {i}"}],
                extra_headers={"X-Episode-Id": eid, "X-Episode-Budget": str(budget)},
            )
        except openai.PermissionDeniedError as e:
            assert e.code == "turn_budget_exhausted", e
            return 403
        return 200

    try:
        return list(await asyncio.gather(*(one(i) for i in range(calls))))
    finally:
        for c in clients:
            await c.close()


@pytest.mark.parametrize("calls,budget,used", [(60, 25, 0), (20, 25, 0), (40, 25, 7)])
def test_concurrent_turns_across_replicas_forward_exactly_what_remains(
    replicas: list[ProxyProcess], fake: FakeUpstream, calls: int, budget: int, used: int
) -> None:
    eid = f"race-{uuid.uuid4().hex[:10]}"
    urls = [p.base_url for p in replicas]
    if used:
        asyncio.run(race(urls[:1], eid, used, budget, tag="first"))
    statuses = asyncio.run(race(urls, eid, calls, budget, tag="second"))
    remaining = budget - used
    assert statuses.count(200) == min(calls, remaining)
    assert statuses.count(403) == calls - min(calls, remaining)
    assert reached(fake, eid) == used + min(calls, remaining)
    view = httpx.get(f"{replicas[1].url}/v1/episodes/{eid}").json()
    assert view["turns_used"] == used + min(calls, remaining)


def test_a_finished_episode_is_finished_on_every_replica(
    replicas: list[ProxyProcess], fake: FakeUpstream
) -> None:
    a, b = replicas
    eid = f"fin-{uuid.uuid4().hex[:10]}"
    client = openai.OpenAI(base_url=a.base_url, api_key="sk-test", max_retries=0)
    client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}],
                                   extra_headers={"X-Episode-Id": eid})
    r = httpx.post(f"{b.url}/v1/episodes/{eid}/outcome", json={"success": True, "reward": 1.0})
    assert r.status_code == 200 and r.json()["end_reason"] == "success"
    assert httpx.post(f"{a.url}/v1/episodes/{eid}/outcome",
                      json={"success": True, "reward": 1.0}).status_code == 200
    assert httpx.post(f"{a.url}/v1/episodes/{eid}/outcome",
                      json={"success": False}).status_code == 409
    with pytest.raises(openai.PermissionDeniedError) as err:
        client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "y"}],
            extra_headers={"X-Episode-Id": eid})
    assert err.value.code == "episode_finished"
    client.close()
    # The episode record is written once, by the replica that ended it.
    d = Path(a.config).parent
    deadline = time.monotonic() + 5
    while not records(d, "episode", eid) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    assert len(records(d, "episode", eid)) == 1


def test_a_restarted_replica_keeps_its_episodes(
    replicas: list[ProxyProcess], fake: FakeUpstream
) -> None:
    a = replicas[0]
    eid = f"keep-{uuid.uuid4().hex[:10]}"
    asyncio.run(race([a.base_url], eid, 3, 10))
    a.stop()  # SIGTERM: the episode is shared, so this replica does not end it
    a.start()
    view = httpx.get(f"{a.url}/v1/episodes/{eid}").json()
    assert (view["status"], view["turns_used"], view["budget"]) == ("active", 3, 10)
    r = httpx.post(f"{a.base_url}/chat/completions", headers={"X-Episode-Id": eid},
                   json={"model": "fake-model", "messages": [{"role": "user", "content": "4"}]})
    assert r.status_code == 200 and r.headers["x-episode-turn"] == "4"
    assert records(Path(a.config).parent, "episode", eid) == []


def test_idle_expiry_ends_an_episode_once_across_replicas(
    tmp_path: Path, fake: FakeUpstream
) -> None:
    require_redis()
    prefix = new_prefix()
    idle = {"idle_timeout_s": 1.0, "sweep_interval_s": 0.2}
    procs = [ProxyProcess(replica_config(tmp_path, n, fake, prefix, episodes=idle),
                          tmp_path / f"{n}.log") for n in "ab"]
    eids = [f"idle-{i}-{uuid.uuid4().hex[:8]}" for i in range(6)]
    try:
        for p in procs:
            p.start()
        for i, eid in enumerate(eids):
            r = httpx.post(f"{procs[i % 2].base_url}/chat/completions",
                           headers={"X-Episode-Id": eid},
                           json={"model": "fake-model", "messages": [{"role": "user",
                                                                      "content": "hi"}]})
            assert r.status_code == 200
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if all(records(tmp_path, "episode", e) for e in eids):
                break
            time.sleep(0.2)
        time.sleep(1.0)  # a second sweep on either replica must not log them again
        for eid in eids:
            recs = records(tmp_path, "episode", eid)
            assert len(recs) == 1, (eid, recs)
            assert recs[0]["end_reason"] == "abandoned"
    finally:
        for p in procs:
            p.stop()
        drop_prefix(prefix)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out.extend(int(c) for c in text)
    return out


def _answered_by(directory: Path, eid: str, turns: int) -> set[str]:
    """The pids of the workers whose trajectory files hold the episode's answered turns, once
    all `turns` are written (a turn's record follows its answer)."""
    deadline = time.monotonic() + 10
    while True:
        pids: set[str] = set()
        found = 0
        for path in directory.glob("*.jsonl"):  # trajectories-{stamp}-{pid}-{seq}.jsonl
            lines = path.read_text().split("\n")[:-1]  # not a line still being written
            mine = [r for r in map(json.loads, filter(None, lines))
                    if r.get("type") == "turn" and r.get("episode_id") == eid
                    and r.get("status") == "ok"]
            if mine:
                pids.add(path.name.split("-")[-2])
                found += len(mine)
        if found >= turns or time.monotonic() > deadline:
            assert found == turns, (found, turns)
            return pids
        time.sleep(0.05)


def test_workers_share_budgets_and_merge_metrics(tmp_path: Path, fake: FakeUpstream) -> None:
    require_redis()
    prefix = new_prefix()
    prom = tmp_path / "prom"
    prom.mkdir()
    cfg = write_config(tmp_path / "w.yaml", fake.base_url,
                       trajectories={"dir": str(tmp_path / "traj-w")},
                       store={"key_prefix": prefix})
    proc = ProxyProcess(cfg, tmp_path / "w.log",
                        extra=["--workers", "2", "--store", REDIS_URL],
                        env={"PROMETHEUS_MULTIPROC_DIR": str(prom)})
    try:
        proc.start()
        assert proc.proc is not None
        deadline = time.monotonic() + 30
        while len(_children(proc.proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_children(proc.proc.pid)) >= 2
        # Races of one episode each until one had its turns answered by both workers: the
        # kernel hands each connection to whichever worker accepts first, and on a busy
        # machine one worker can take a whole race. Every race spends exactly its budget.
        races, deadline = 0, time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, f"{races} races, each answered by one worker"
            eid = f"workers-{uuid.uuid4().hex[:10]}"
            # New connections per call, so the kernel spreads them over the workers.
            statuses = asyncio.run(race([proc.base_url] * 8, eid, 48, 30))
            assert statuses.count(200) == 30 and statuses.count(403) == 18
            assert reached(fake, eid) == 30
            races += 1
            if len(_answered_by(tmp_path / "traj-w", eid, 30)) >= 2:
                break
        served = {p.name.split("_")[-1] for p in prom.glob("counter_*.db")}
        assert len(served) >= 2, served  # both workers' metrics are merged below
        # A turn is counted just after its answer is sent: let the last ones land first.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and metric_total(
            httpx.get(f"{proc.url}/metrics", timeout=10).text, "budgetproxy_turns_total"
        ) < 30 * races:
            time.sleep(0.05)
        totals = set()
        for _ in range(6):
            text = httpx.get(f"{proc.url}/metrics", timeout=10).text
            totals.add((
                metric_total(text, "budgetproxy_turns_total"),
                metric_total(text, "budgetproxy_budget_exhausted_total"),
                metric_total(text, "budgetproxy_episodes_started_total"),
            ))
        assert totals == {(30.0 * races, 18.0 * races, float(races))}
    finally:
        proc.stop()
        drop_prefix(prefix)


def test_workers_remove_the_metrics_directory_they_made(tmp_path: Path,
                                                       fake: FakeUpstream) -> None:
    require_redis()
    prefix = new_prefix()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    cfg = write_config(tmp_path / "w.yaml", fake.base_url,
                       trajectories={"dir": str(tmp_path / "traj")},
                       store={"key_prefix": prefix})
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    proc = ProxyProcess(cfg, tmp_path / "w.log", extra=["--workers", "2", "--store", REDIS_URL])
    proc.env = {**env, "TMPDIR": str(tmp)}
    try:
        proc.start()
        r = httpx.post(f"{proc.base_url}/chat/completions", timeout=10, json={
            "model": "fake-model", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200
        (made,) = tmp.glob("budgetproxy-prom-*")
        assert any(made.glob("*.db"))  # the workers wrote their metrics there
    finally:
        assert proc.stop() == 0
        drop_prefix(prefix)
    assert not any(tmp.iterdir())


def test_workers_with_the_memory_store_are_refused(fake: FakeUpstream) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "budgetproxy", "serve", "--workers", "2", "--upstream",
         fake.base_url, "--port", "0"],
        capture_output=True, text=True, timeout=60, env={**os.environ},
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "workers" in lines[0] and "redis" in lines[0]


async def burst(urls: list[str], episodes: list[str], calls: int) -> list[int]:
    """`calls` concurrent first calls spread over `episodes` and the replicas; their statuses.
    (A plain HTTP client: the official one builds requests slowly enough on two shared cores
    that a burst never reaches the proxy at once.)"""
    limits = httpx.Limits(max_connections=calls, max_keepalive_connections=calls)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        async def one(i: int) -> int:
            eid = episodes[i % len(episodes)]
            r = await client.post(
                f"{urls[i % len(urls)]}/chat/completions",
                json={"model": "fake-model",
                      "messages": [{"role": "user", "content": f"{eid} burst {i}"}]},
                headers={"X-Episode-Id": eid, "X-Episode-Budget": "100000"})
            return r.status_code

        return list(await asyncio.gather(*(one(i) for i in range(calls))))


@pytest.mark.parametrize("calls,episodes", [(256, 1), (1280, 20)])
def test_a_burst_with_redis_healthy_is_answered_without_5xx(
    replicas: list[ProxyProcess], fake: FakeUpstream, calls: int, episodes: int
) -> None:
    """Hundreds of calls at once on new episodes (the creation path included) wait for a
    Redis connection instead of reading a healthy Redis as unavailable."""
    ids = [f"burst-{uuid.uuid4().hex[:10]}" for _ in range(episodes)]
    statuses = asyncio.run(burst([p.base_url for p in replicas], ids, calls))
    assert statuses.count(200) == calls, {s: statuses.count(s) for s in set(statuses)}
    used = sum(httpx.get(f"{replicas[0].url}/v1/episodes/{e}").json()["turns_used"]
               for e in ids)
    assert used == calls


def test_sigkill_under_load_leaves_a_readable_log_with_each_turn_at_most_once(
    tmp_path: Path, fake: FakeUpstream, prefix: str
) -> None:
    """SIGKILL (no drain) while 32 episodes call at once. What the log holds afterwards: every
    line whole but at most a file's last, no turn twice, and the turns the clients were
    answered missing at most what the writer still held (a flush interval's worth,
    `trajectories.flush_interval_s`, at the rate they were answered); a new process on the same
    directory and Redis goes on with the same episodes."""
    import signal

    cfg = replica_config(tmp_path, "k", fake, prefix)
    proc = ProxyProcess(cfg, tmp_path / "k.log").start()
    answered: list[tuple[str, int]] = []
    ids = [f"kill-{uuid.uuid4().hex[:8]}-{i}" for i in range(32)]

    async def load() -> None:
        async with httpx.AsyncClient(timeout=10) as client:
            async def agent(eid: str) -> None:
                n = 0
                while True:
                    n += 1
                    try:
                        r = await client.post(f"{proc.base_url}/chat/completions", json={
                            "model": "fake-model",
                            "messages": [{"role": "user", "content": f"{eid} turn {n}"}]},
                            headers={"X-Episode-Id": eid, "X-Episode-Budget": "100000"})
                    except httpx.HTTPError:
                        return  # the proxy is gone
                    if r.status_code == 200:
                        answered.append((eid, int(r.headers["x-episode-turn"])))

            tasks = [asyncio.ensure_future(agent(e)) for e in ids]
            await asyncio.sleep(3.0)
            assert proc.proc is not None
            proc.proc.send_signal(signal.SIGKILL)
            await asyncio.gather(*tasks)

    asyncio.run(load())
    assert proc.proc is not None and proc.proc.wait(10) == -signal.SIGKILL
    proc.proc = None
    logged: list[tuple[str, int]] = []
    unreadable = 0
    for path in (tmp_path / "traj-k").glob("*.jsonl"):
        lines = path.read_bytes().split(b"\n")
        for i, line in enumerate(lines):
            if not line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                assert i == len(lines) - 1, f"a torn line inside {path.name}"
                unreadable += 1
                continue
            if rec["type"] == "turn" and rec["status"] == "ok":
                logged.append((rec["episode_id"], rec["turn"]))
    assert len(logged) == len(set(logged)), "a turn was logged twice"
    missing = set(answered) - set(logged)
    assert len(answered) > 100
    print(f"SIGKILL: {len(answered)} turns answered, {len(missing)} not logged, "
          f"{unreadable} torn last line(s)")
    # (the load ran 3 s; what the writer holds is at most a flush interval's records)
    held = math.ceil(len(answered) / 3.0 * TrajectoriesConfig().flush_interval_s)
    assert len(missing) <= max(10, len(answered) // 50) + held, (len(missing), len(answered))
    with ProxyProcess(cfg, tmp_path / "k2.log") as again:
        r = httpx.post(f"{again.base_url}/chat/completions", json={
            "model": "fake-model", "messages": [{"role": "user", "content": "after"}]},
            headers={"X-Episode-Id": ids[0]}, timeout=10)
        assert r.status_code == 200
        turns_before = max(t for e, t in answered if e == ids[0])
        assert int(r.headers["x-episode-turn"]) > turns_before


def test_a_cold_replica_re_applies_the_texts_a_warm_one_would(
    tmp_path: Path, fake: FakeUpstream, prefix: str
) -> None:
    """history: keep across replicas. The same conversation (growing, then rewritten, then
    growing again) played on one replica, whose calls after the first hold their episode's
    last answer (the store sends only the newest placement), and on two replicas taking
    turns, each of whose calls comes after one the other served (the store sends them all):
    the upstream gets the same messages, texts and all, on every turn."""
    disclosure = {"mode": "disclosed", "placement": "last_message", "history": "keep"}
    procs = [ProxyProcess(replica_config(tmp_path, n, fake, prefix, disclosure=disclosure),
                          tmp_path / f"{n}.log") for n in "wxy"]
    marker = uuid.uuid4().hex[:10]
    turns: list[list[dict[str, str]]] = []
    msgs = [{"role": "system", "content": f"sys {marker}"}]
    for t in range(1, 15):
        if t == 8:  # a summarised history: the texts placed before it do not come back
            msgs = [msgs[0], {"role": "user", "content": "summary"},
                    {"role": "assistant", "content": "ok"}]
        msgs = [*msgs, {"role": "user", "content": f"u{t}"}]
        turns.append(msgs)
        msgs = [*msgs, {"role": "assistant", "content": f"a{t}"}]

    def play(urls: list[str]) -> list[Any]:
        eid = f"cold-{uuid.uuid4().hex[:10]}"
        sent = []
        for t, conversation in enumerate(turns):
            r = httpx.post(f"{urls[t % len(urls)]}/chat/completions",
                           headers={"X-Episode-Id": eid},
                           json={"model": "fake-model", "messages": conversation})
            assert r.status_code == 200, r.text
            with fake._lock:
                body = [q.body for q in fake.requests if marker.encode() in q.body][-1]
            sent.append(json.loads(body)["messages"])
        return sent

    try:
        for p in procs:
            p.start()
        warm = play([procs[0].base_url])
        cold = play([procs[1].base_url, procs[2].base_url])
    finally:
        for p in procs:
            p.stop()
    assert cold == warm
    # each turn's text went back where it was placed, until the rewrite
    told = [sum("[Turn budget]" in str(m.get("content", "")) for m in sent) for sent in warm]
    assert told == [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7], told
