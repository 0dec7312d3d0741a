"""The C heap's metric through the real server: what glibc holds in use and free, read by the
idle sweep, moves with the process's own blocks (the server runs in this process)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Proxy, ProxyFactory, eventually

MIB = 1 << 20


def _heap(p: Proxy) -> dict[str, float]:
    text = httpx.get(p.url + "/metrics", timeout=10).text
    return {sample.labels["state"]: sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name == "budgetproxy_heap_bytes"}


def _when(p: Proxy, ready: Callable[[dict[str, float]], bool]) -> dict[str, float]:
    return eventually(lambda: _heap(p), ready)


def test_the_heap_metric_follows_the_blocks_the_process_holds(proxy: ProxyFactory) -> None:
    p = proxy({"episodes": {"sweep_interval_s": 0.05}, "metrics": {"enabled": True}},
              fresh=True)
    before = _when(p, lambda heap: set(heap) == {"in_use", "free"})
    assert set(before) == {"in_use", "free"}, before  # (glibc: the machines this runs on)
    assert before["in_use"] > MIB and before["free"] >= 0
    block = bytearray(64 * MIB)  # a block glibc maps alone: in use while it lives
    held = _when(p, lambda heap: heap["in_use"] >= before["in_use"] + 60 * MIB)
    assert held["in_use"] >= before["in_use"] + 60 * MIB, (before, held)
    del block
    after = _when(p, lambda heap: heap["in_use"] < held["in_use"] - 60 * MIB)
    assert after["in_use"] < held["in_use"] - 60 * MIB, (held, after)
