"""`budgetproxy serve` as a process: bad configs, flags over the file, SIGTERM under traffic."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import free_port, new_id, read_jsonl

from budgetproxy.testing import FakeUpstream


def serve(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "budgetproxy", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )


def first_line(proc: subprocess.Popen[str], timeout: float = 20.0) -> str:
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        proc.kill()
        raise AssertionError("budgetproxy serve printed nothing") from None


@pytest.mark.parametrize(
    ("yaml_text", "key"),
    [
        ("budget: {on_exhausted: explode}\n", "budget.on_exhausted"),
        ("episodes: {idle_timeout_s: -1}\n", "episodes.idle_timeout_s"),
        ("upstreams: [{name: x, base_url: 'http://127.0.0.1:9/v1', timeout_s: soon}]\n",
         "upstreams.0.timeout_s"),
        ("disclosure: {bogus: true}\n", "disclosure.bogus"),
    ],
)
def test_bad_config_exits_nonzero_with_one_line_naming_the_key(
    tmp_path: Path, yaml_text: str, key: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml_text)
    proc = serve("--config", str(bad), "--port", "0", cwd=tmp_path)
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode != 0
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert key in lines[0], err
    assert "Traceback" not in err and out == ""


def test_no_upstream_is_a_config_error(tmp_path: Path) -> None:
    proc = serve("--port", "0", cwd=tmp_path)
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode != 0
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "upstreams" in lines[0], err


@pytest.mark.parametrize(
    ("args", "expected"),
    [(["--upstream", "http://127.0.0.1:9/v1", "--workers", "2"],
      "budgetproxy: bad config: server.workers: more than one worker needs a shared store"),
     (["--upstream", "http://127.0.0.1:9"],
      "budgetproxy: bad config: upstreams.0.base_url: needs the API path")],
)
def test_config_errors_name_what_the_user_typed(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    """A config error is one line, exit 2, naming the key as the user wrote it: a check
    across sections names its own key (`server.workers`), and a bad `--upstream` says it
    was given as --upstream."""
    proc = serve("--port", "0", *args, cwd=tmp_path)
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 2
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert line.startswith(expected), line
    if "base_url" in expected:
        assert line.endswith("(given as --upstream)"), line


@pytest.mark.parametrize(
    ("package", "args", "key"),
    [("redis", ["--workers", "2", "--store", "redis://127.0.0.1:6379/0"], "store.kind"),
     ("redis", ["--store", "redis://127.0.0.1:6379/0"], "store.kind")],
)
def test_a_missing_extra_is_one_line_not_a_worker_crash_loop(
    tmp_path: Path, package: str, args: list[str], key: str
) -> None:
    """As if the package were not installed (an import of it fails): one line naming the key
    and the extra, exit 2, before any worker starts."""
    code = (f"import sys; sys.modules[{package!r}] = None; from budgetproxy.cli import main; "
            f"raise SystemExit(main(sys.argv[1:]))")
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "serve", "--upstream", "http://127.0.0.1:9/v1",
         "--port", "0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 2, (out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and key in lines[0] and f"budgetproxy[{package}]" in lines[0], err
    assert out == ""


@pytest.fixture()
def served(
    upstream: FakeUpstream, tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    config = tmp_path / "config.yaml"
    config.write_text("budget: {default_turns: 9}\n"
                      "server: {shutdown_timeout_s: 20, forward_headers: [x-fake-*]}\n")
    port = free_port()
    log_dir = tmp_path / "logs"
    proc = serve(
        "--config", str(config), "--upstream", upstream.base_url, "--port", str(port),
        "--log-dir", str(log_dir), "--default-budget", "5", cwd=tmp_path,
    )
    line = first_line(proc)
    url = f"http://127.0.0.1:{port}"
    assert url in line, line
    yield proc, url, log_dir
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


@pytest.mark.slow
def test_sigterm_during_traffic_finishes_calls_and_loses_no_record(
    served: tuple[subprocess.Popen[str], str, Path], upstream: FakeUpstream
) -> None:
    proc, url, log_dir = served
    tag = new_id("sigterm")
    episodes = [new_id("term") for _ in range(6)]
    answers: list[tuple[int, dict[str, str], dict[str, Any]]] = []
    lock = threading.Lock()

    def call(eid: str, text: str, delay_ms: int) -> None:
        r = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "m1", "messages": [{"role": "user", "content": text}]},
            headers={"X-Episode-Id": eid, "X-Fake-Delay-Ms": str(delay_ms)},
            timeout=30,
        )
        with lock:
            answers.append((r.status_code, dict(r.headers), r.json()))

    # A quick first turn on each episode, then a slow second one that is in flight at SIGTERM.
    for eid in episodes:
        call(eid, f"{tag} quick {eid}", 0)
    threads = [
        threading.Thread(target=call, args=(eid, f"{tag} slow {eid} {i}", 1500))
        for i, eid in enumerate(episodes * 2)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while sum(1 for r in upstream.requests if f"{tag} slow" in r.body.decode()) < len(threads):
        assert time.monotonic() < deadline, "slow calls never reached the upstream"
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(30)
    assert proc.wait(30) == 0, proc.stderr.read() if proc.stderr else ""

    assert len(answers) == len(episodes) * 3
    assert all(status == 200 for status, _, _ in answers), answers
    assert {h["x-episode-budget"] for _, h, _ in answers} == {"5"}  # the flag beat the file

    records = read_jsonl(log_dir)
    assert all(r["schema"] == 1 for r in records)
    turns = {(r["episode_id"], r["turn"]): r for r in records if r["type"] == "turn"}
    for _, headers, body in answers:
        key = (headers["x-episode-id"], int(headers["x-episode-turn"]))
        assert key in turns, key
        assert turns[key]["response"]["content"] == body["choices"][0]["message"]["content"]
    assert len(turns) == len(answers)
    ended = [r for r in records if r["type"] == "episode"]
    assert sorted(r["episode_id"] for r in ended) == sorted(episodes)
    assert {r["end_reason"] for r in ended} == {"abandoned"}
    assert {r["turns_used"] for r in ended} == {3}
    json.dumps(records)  # plain JSON all the way down


def _read_response(s: Any) -> bytes:
    """Everything the server sends until it closes the connection (it says `connection:
    close`); one recv may return the head alone, the chunked body in later segments."""
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def test_calls_unanswered_at_the_shutdown_deadline_get_a_json_503(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    """A client that stalls mid-upload, or a call slower than server.shutdown_timeout_s, holds
    shutdown until the deadline; then the server cancels it, and it is answered an
    OpenAI-shaped JSON 503 `shutting_down`, and the server exits 0."""
    import socket

    config = tmp_path / "config.yaml"
    config.write_text("server: {shutdown_timeout_s: 1, forward_headers: [x-fake-*]}\n")
    port = free_port()
    proc = serve("--config", str(config), "--upstream", upstream.base_url, "--port", str(port),
                 "--log-dir", str(tmp_path / "logs"), cwd=tmp_path)
    slow: list[httpx.Response] = []
    eid = new_id("deadline")
    caller = threading.Thread(target=lambda: slow.append(httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions", timeout=30,
        json={"model": "m1", "messages": [{"role": "user", "content": "slow"}]},
        headers={"X-Episode-Id": eid, "X-Fake-Delay-Ms": "2500"})))
    try:
        assert f":{port}" in first_line(proc)
        started = time.monotonic()
        caller.start()
        stalled = []
        for path in ("/v1/chat/completions", "/v1/episodes"):
            s = socket.create_connection(("127.0.0.1", port), timeout=20)
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: 1000\r\n\r\n{{\"model\":".encode())
            stalled.append(s)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        for s in stalled:
            head, _, body = _read_response(s).partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503"), head
            assert b"content-type: application/json" in head.lower()
            assert b'"code":"shutting_down"' in body  # chunked: the JSON sits between sizes
            s.close()
        caller.join(20)
        (r,) = slow
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
        assert proc.wait(20) == 0
        assert proc.stderr is not None
        assert "Traceback" not in proc.stderr.read()
        records = read_jsonl(tmp_path / "logs")
        (turn,) = [x for x in records if x["type"] == "turn" and x["episode_id"] == eid]
        assert (turn["status"], turn["http_status"], turn["charged"]) == ("rejected", 503, False)
        (ended,) = [x for x in records if x["type"] == "episode" and x["episode_id"] == eid]
        assert ended["turns_used"] == 0 and ended["end_reason"] == "abandoned"
        time.sleep(max(0.0, started + 2.7 - time.monotonic()))  # the upstream's answer is done
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_unknown_key_suggests_the_nearest_valid_name(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("budget: {default_turn: 3}\n"
                   "upstreams: [{base_url: 'http://127.0.0.1:9/v1'}]\n")
    proc = serve("--config", str(bad), "--check", cwd=tmp_path)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and out == ""
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert line == ("budgetproxy: bad config: budget.default_turn: unknown key "
                    "(did you mean `default_turns`?)")


def test_check_reports_every_bad_key_a_line_each(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("budget: {default_turn: 3, on_exhausted: stop}\n"
                   "server: {port: -1}\n"
                   "disclosure: {template: '{nope}'}\n"
                   "upstreams: [{base_url: 'ftp://127.0.0.1:9/v1'}]\n")
    proc = serve("--config", str(bad), "--check", cwd=tmp_path)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and out == ""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert all(ln.startswith("budgetproxy: bad config: ") for ln in lines), lines
    keys = sorted(ln.removeprefix("budgetproxy: bad config: ").split(":")[0] for ln in lines)
    assert keys == ["budget.default_turn", "budget.on_exhausted", "disclosure.template",
                    "server.port", "upstreams.0.base_url"], lines


def test_check_prints_the_effective_config_with_secrets_masked(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(
        "upstreams: [{base_url: 'http://user:hunter2@127.0.0.1:9/v1', api_key: sk-secret}]\n"
        "auth: {keys: [client-secret]}\n"
        "store: {kind: redis, url: 'redis://:redispw@127.0.0.1:6379/0'}\n"
        "budget: {default_turns: 7}\n")
    proc = serve("--config", str(good), "--check", "--port", "9999", cwd=tmp_path)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    import yaml

    shown = yaml.safe_load(out)
    assert shown["budget"]["default_turns"] == 7 and shown["server"]["port"] == 9999
    assert shown["upstreams"][0]["api_key"] == "***"
    assert shown["upstreams"][0]["base_url"] == "http://user:***@127.0.0.1:9/v1"
    assert shown["auth"]["keys"] == ["***"]
    assert shown["store"]["url"] == "redis://:***@127.0.0.1:6379/0"
    for secret in ("sk-secret", "hunter2", "client-secret", "redispw"):
        assert secret not in out + err
    assert not (tmp_path / "trajectories").exists()  # --check starts nothing


def test_ctrl_c_drains_says_so_and_exits_0(served: tuple[subprocess.Popen[str], str, Path]) -> None:
    proc, url, _ = served
    assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=40)
    assert proc.returncode == 0, (out, err)
    assert "SIGINT: draining" in out and "stopped after a clean drain" in out, out
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
