"""bench/run.py's Portkey row: the pinned gateway serves the fake upstream's answers through
the headers the row sends; without Node.js the row is skipped with a note."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import targets as tg  # noqa: E402


def test_without_node_the_portkey_row_is_skipped_with_a_note(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(tg.shutil, "which", lambda name: None)
    row = tg.start_portkey(tmp_path, "http://127.0.0.1:9/v1", create=True)
    assert row.proc is None and "Node.js is not installed" in row.skip


def test_headers_of_a_row_read_as_wrk_reads_them() -> None:
    row = tg.Target("x", "x", headers="x-portkey-provider: openai; "
                                      "x-portkey-custom-host: http://127.0.0.1:8000/v1")
    assert row.header_dict() == {"x-portkey-provider": "openai",
                                 "x-portkey-custom-host": "http://127.0.0.1:8000/v1"}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_portkey_row_forwards_to_the_upstream(upstream: object, tmp_path: Path) -> None:
    if shutil.which("node") is None:
        pytest.fail("Node.js is not installed: apt-get install nodejs npm", pytrace=False)
    base = upstream.base_url  # type: ignore[attr-defined]
    row = tg.start_portkey(tmp_path, base, create=True)
    try:
        assert not row.skip, row.skip
        r = httpx.post(row.chat_url, json={"model": "m1", "messages": [
            {"role": "user", "content": "through portkey"}]},
            headers={**row.header_dict(), "Authorization": f"Bearer {row.auth}"}, timeout=20)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "echo: through portkey"
        assert tg.portkey_version() in row.description
    finally:
        tg.stop(row.proc)
