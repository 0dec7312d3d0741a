"""Client keys: an empty one is a config error (not an open door), keys come from the config,
its environment variables or a file, and are compared in constant time (core.keys)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ProxyFactory, assert_openai_error, chat_body, new_id

from budgetproxy.config import ConfigError, load_config
from budgetproxy.core.keys import KeyRing, Principal


def _serve_check_config(tmp_path: Path, yaml_text: str, env: dict[str, str] | None = None
                        ) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml_text)
    environ = {k: v for k, v in os.environ.items() if k != "PROXY_KEY"} | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "budgetproxy", "serve", "--config", str(cfg), "--port", "0",
         "--upstream", "http://127.0.0.1:9/v1"],
        capture_output=True, text=True, cwd=tmp_path, env=environ, timeout=60)


@pytest.mark.parametrize(("yaml_text", "key"), [
    ('auth: {keys: ["${PROXY_KEY}"]}\n', "auth.keys.0.key"),
    ('auth: {keys: ["k1", "   "]}\n', "auth.keys.1.key"),
    ('auth: {keys: [{key: "", tenant: a}]}\n', "auth.keys.0.key"),
    ('auth: {admin_keys: ["${PROXY_KEY}"]}\n', "auth.admin_keys"),
    ("auth: {keys_file: ./missing-keys}\n", "auth.keys_file"),
])
def test_an_empty_or_unreadable_key_stops_serve_with_one_line(
        tmp_path: Path, yaml_text: str, key: str) -> None:
    proc = _serve_check_config(tmp_path, yaml_text)
    assert proc.returncode == 2, proc
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and key in lines[0], proc.stderr
    assert proc.stdout == ""
    if "${PROXY_KEY}" in yaml_text:
        assert "PROXY_KEY" in lines[0]  # the unset variable is named


def test_a_keys_file_holds_keys_and_tenants(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# client keys\nk-one\n\nk-two team-b\n")
    cfg = load_config(None, {"auth": {"keys_file": str(path), "keys": ["k-zero"]}})
    assert [(k.key, k.tenant) for k in cfg.auth.client_keys()] == [
        ("k-zero", None), ("k-one", None), ("k-two", "team-b")]
    path.write_text("k1 t1 extra\n")
    with pytest.raises(ConfigError, match=r"auth\.keys_file: .* line 1"):
        load_config(None, {"auth": {"keys_file": str(path)}})
    path.write_text("# nothing\n")
    with pytest.raises(ConfigError, match=r"auth\.keys_file: .* holds no key"):
        load_config(None, {"auth": {"keys_file": str(path)}})


def test_a_key_from_the_environment(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text('auth: {keys: ["${PROXY_KEY}"]}\n')
    loaded = load_config(cfg, environ={"PROXY_KEY": "from-env"})
    assert [k.key for k in loaded.auth.client_keys()] == ["from-env"]


def test_the_key_ring_names_who_a_key_is() -> None:
    ring = KeyRing([("a", None), ("b", "t-b")], ["adm"])
    assert ring.principal(b"Bearer a") == Principal(None)
    assert ring.principal(b"Bearer b") == Principal("t-b")
    assert ring.principal(b"Bearer adm") == Principal(None, admin=True)
    for wrong in (None, b"", b"Bearer ", b"Bearer a ", b"bearer a", b"Bearer ab", b"a"):
        assert ring.principal(wrong) is None, wrong
    assert KeyRing([]).principal(None) == Principal()  # no keys: open


def test_an_empty_bearer_is_refused_by_the_running_proxy(proxy: ProxyFactory,
                                                         tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("file-key\n")
    p = proxy({"auth": {"keys_file": str(keys)}})
    body = chat_body(new_id("k"))
    for auth in ("Bearer", "Bearer file-key-and-more", "file-key"):
        r = p.http().post("/v1/chat/completions", json=body, headers={"Authorization": auth})
        assert_openai_error(r, 401, "invalid_api_key")
        r = p.http().get("/v1/models", headers={"Authorization": auth})
        assert_openai_error(r, 401, "invalid_api_key")
    r = p.http().post("/v1/chat/completions", json=body,
                      headers={"Authorization": "Bearer file-key"})
    assert r.status_code == 200, r.text
    # "Bearer " with its space, as an unset variable leaves it (HTTP clients refuse to send it)
    host, port = p.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \r\n"
                  b"Connection: close\r\n\r\n")
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 401 "), answer
