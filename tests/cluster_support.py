"""A real Redis Cluster for the tests: redis-server processes with cluster mode on free
ports, joined by `redis-cli --cluster create`; masters can be killed to force a failover."""

from __future__ import annotations

import random
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_ports(n: int) -> list[int]:
    """`n` free ports whose cluster bus ports (port + 10000) are free too."""
    ports: list[int] = []
    while len(ports) < n:
        p = random.randint(20000, 50000)
        if p not in ports and _port_free(p) and _port_free(p + 10000):
            ports.append(p)
    return ports


@dataclass
class RedisCluster:
    """`masters` masters and `replicas` replicas per master, under `workdir`."""

    workdir: Path
    masters: int = 3
    replicas: int = 0
    ports: list[int] = field(default_factory=list)
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def start(self) -> RedisCluster:
        for binary in ("redis-server", "redis-cli"):
            if shutil.which(binary) is None:
                pytest.fail(f"{binary} is not installed; the cluster tests need it "
                            "(apt-get install redis-server)")
        self.ports = cluster_ports(self.masters * (1 + self.replicas))
        for port in self.ports:
            self.procs[port] = subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                 "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                 "--cluster-node-timeout", "1000", "--save", "", "--appendonly", "no",
                 "--dir", str(self.workdir)],
                stdout=open(self.workdir / f"log-{port}", "wb"), stderr=subprocess.STDOUT)
        for port in self.ports:
            self._wait(lambda p=port: self.node(p).ping())
        subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            check=True, capture_output=True, timeout=60)
        self.wait_ok()
        return self

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2,
                           decode_responses=True)

    def alive(self) -> list[int]:
        return [p for p, proc in self.procs.items() if proc.poll() is None]

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every live node says the cluster is ok and agrees on the masters."""
        def ok() -> bool:
            for p in self.alive():
                if self.node(p).cluster("info")["cluster_state"] != "ok":
                    return False
            return len(self.master_ports()) == self.masters
        self._wait(ok, timeout)

    def master_ports(self) -> list[int]:
        """The ports of the masters serving slots, as a live node sees them."""
        nodes = self.node(self.alive()[0]).cluster("nodes")
        out = []
        for addr, n in nodes.items():
            flags = n["flags"]
            if "master" in flags and "fail" not in flags and n.get("slots"):
                out.append(int(addr.split(":")[1].split("@")[0]))
        return sorted(out)

    def owner_of(self, key: str) -> int:
        """The port of the master serving `key`'s slot."""
        any_node = self.node(self.alive()[0])
        slot = int(any_node.execute_command("CLUSTER", "KEYSLOT", key))
        for start, end, master, *_ in any_node.execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(master[1])
        raise AssertionError(f"no master serves slot {slot}")

    def synced(self, master: int, timeout: float = 10.0) -> None:
        """Until every replica of `master` has all it wrote (replication is asynchronous)."""
        def caught_up() -> bool:
            info = self.node(master).info("replication")
            offset = info["master_repl_offset"]
            replicas = [v for k, v in info.items() if k.startswith("slave")]
            return bool(replicas) and all(r["offset"] >= offset for r in replicas)
        self._wait(caught_up, timeout)

    def replicated(self, master: int) -> bool:
        """Whether `master` has a replica that is online and follows it (its link up)."""
        info = self.node(master).info("replication")
        for k, v in info.items():
            if k.startswith("slave") and v.get("state") == "online":
                mine = self.node(int(v["port"])).info("replication")
                if mine.get("master_link_status") == "up" and int(mine["master_port"]) == master:
                    return True
        return False

    def replicas_hold(self, master: int, key: str, want: dict[str, str],
                      timeout: float = 10.0) -> None:
        """Until every replica of `master` holds `want` in the hash `key`, read on the replica
        itself (its replication offset alone can be read before the data is applied)."""
        def held() -> bool:
            info = self.node(master).info("replication")
            ports = [int(v["port"]) for k, v in info.items() if k.startswith("slave")]
            for port in ports:
                replica = self.node(port)
                replica.execute_command("READONLY")
                got = replica.hmget(key, list(want))
                if [g.decode() if isinstance(g, bytes) else g for g in got] != list(want.values()):
                    return False
            return bool(ports)
        self._wait(held, timeout)

    def kill(self, port: int) -> None:
        self.procs[port].send_signal(signal.SIGKILL)
        self.procs[port].wait(10)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    @staticmethod
    def _wait(check: object, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        last: BaseException | None = None
        while time.monotonic() < deadline:
            try:
                if check():  # type: ignore[operator]
                    return
            except (redis.RedisError, OSError) as e:
                last = e
            time.sleep(0.1)
        raise AssertionError(f"the Redis cluster did not get there in {timeout}s ({last})")
