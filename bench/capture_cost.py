"""What token capture costs per call and per 1,000 sampled tokens.

Two measurements:
1. CPU time of the capture steps alone (in process, no sockets): adding the request fields,
   stripping a vLLM-shaped answer for the client (a body, or a stream's events) and reading
   the ids and logprobs back, for answers of 10 to 4,000 tokens. A least-squares line over
   the sizes gives the fixed cost per call and the cost per 1,000 tokens.
2. End to end: a real proxy with capture on and one with it off, both in front of the fake
   upstream answering with vLLM's fields (X-Fake-Token-Server: vllm), driven one call at a
   time by httpx, alternating, for the median latency of each.

    python bench/capture_cost.py [--calls 400]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import orjson

from budgetproxy.proxy import capture
from budgetproxy.testing import fake_tokens

SIZES = (10, 100, 500, 1000, 2000, 4000)


def _answer(n_tokens: int) -> str:
    return "".join(f" w{i % 97}" for i in range(n_tokens - 1))  # +END = n_tokens


def _body(n: int) -> tuple[bytes, dict[str, Any]]:
    req = {"model": "m", "messages": [{"role": "user", "content": "hi " * 50}],
           "return_token_ids": True, "logprobs": True}
    body = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": _answer(n)},
                         "logprobs": None, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}}
    return orjson.dumps(fake_tokens.chat_body(body, req, "vllm")), req


def _events(n: int, req: dict[str, Any]) -> list[bytes]:
    text = _answer(n)
    pieces = fake_tokens.pieces(text)
    head = b'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"m",'

    def ev(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return head + b'"choices":' + orjson.dumps([choice]) + b"}\n\n"

    raw = [ev({"role": "assistant", "content": ""}), *(ev({"content": p}) for p in pieces),
           ev({}, "stop")]
    return [e for e in fake_tokens.chat_events(iter(raw), req, "vllm")
            if isinstance(e, bytes)] + [b"data: [DONE]\n\n"]


def _time(fn: Any, repeat: int) -> float:
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        for _ in range(repeat):
            fn()
        best = min(best, (time.process_time() - t0) / repeat)
    return best


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, slope


def cpu_costs() -> None:
    print("capture CPU per call, in process (best of 3), microseconds")
    print(f"{'tokens':>7} {'request':>8} {'body strip':>11} {'body read':>10} "
          f"{'stream strip':>13} {'stream read':>12}")
    rows = []
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    raw_req = orjson.dumps(payload)
    for n in SIZES:
        body, req = _body(n)
        events = _events(n, req)
        cap = capture.Capture("chat", "vllm", strip_ids=True, strip_logprobs=True)
        rep = max(20, 20000 // n)

        def request() -> None:
            p = dict(payload)
            _, add = capture.plan(p, "chat", "vllm")
            capture.add_fields(raw_req, p, add)

        t_req = _time(request, rep)
        t_bs = _time(lambda: capture.strip(body, cap), rep)  # noqa: B023
        t_br = _time(lambda: capture.read_body(body), rep)  # noqa: B023
        t_ss = _time(lambda: [capture.strip_event(e, cap) for e in events], rep)  # noqa: B023
        t_sr = _time(lambda: capture.read_events(events), rep)  # noqa: B023
        rows.append((n, t_req, t_bs + t_br, t_ss + t_sr))
        print(f"{n:>7} {t_req * 1e6:>8.1f} {t_bs * 1e6:>11.1f} {t_br * 1e6:>10.1f} "
              f"{t_ss * 1e6:>13.1f} {t_sr * 1e6:>12.1f}")
    xs = [float(r[0]) for r in rows]
    for label, col in (("plain", 2), ("stream", 3)):
        fixed, per_token = _fit(xs, [r[1] + r[col] for r in rows])
        print(f"{label}: {fixed * 1e6:.1f} us per call + {per_token * 1e9:.1f} us per 1,000 "
              f"tokens (least squares over {len(xs)} sizes)")


def end_to_end(calls: int) -> None:
    import httpx

    from budgetproxy.config import load_config
    from budgetproxy.serve.server import ProxyServer
    from budgetproxy.testing import FakeUpstream

    up = FakeUpstream(record=False).start()
    servers = []
    try:
        for on in (True, False):
            cfg = load_config(None, {
                "upstreams": [{"name": "u", "base_url": up.base_url, "capture_tokens": on}],
                "trajectories": {"enabled": False}, "metrics": {"enabled": False}})
            servers.append(ProxyServer(cfg).start())
        body = {"model": "m", "messages": [{"role": "user", "content": "word " * 200}]}
        lat: dict[bool, list[float]] = {True: [], False: []}
        with httpx.Client(timeout=20) as c:
            for i in range(calls):
                for on, srv in zip((True, False), servers, strict=True):
                    t0 = time.perf_counter()
                    r = c.post(srv.url + "/v1/chat/completions", json=body,
                               headers={"X-Episode-Id": f"cap-{on}-{i}",
                                        "X-Fake-Token-Server": "vllm"})
                    lat[on].append(time.perf_counter() - t0)
                    assert r.status_code == 200
        on_ms = statistics.median(lat[True]) * 1e3
        off_ms = statistics.median(lat[False]) * 1e3
        print(f"end to end, {calls} calls each, ~200-token answers: capture on p50 "
              f"{on_ms:.3f} ms, off {off_ms:.3f} ms, difference {on_ms - off_ms:+.3f} ms")
    finally:
        for s in servers:
            s.stop()
        up.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=400)
    args = p.parse_args()
    cpu_costs()
    end_to_end(args.calls)


if __name__ == "__main__":
    main()
