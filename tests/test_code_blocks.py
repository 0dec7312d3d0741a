"""Every code block in README.md and docs/ runs as written, against a real proxy in front of
the fake upstream; the blocks that cannot run here say so in the page.

- python: executed in order, one namespace per page, in a folder holding the proxy's
  trajectory log (`./trajectories`) and the README's config (`./budgetproxy.yaml`);
- bash: executed in that folder (`budgetproxy` is this checkout's, curl fails on an HTTP
  error), and every `budgetproxy ...` command in it, run or not, is parsed by the real
  command line parser (a wrong flag or subcommand fails);
- yaml: a config block is checked with `budgetproxy serve --config FILE --check`;
- toml: parsed;
- any other fenced language must be marked; unlabeled and `text` blocks are shown output,
  shapes and synopses, not code.

Only the proxy's address differs from what the pages show. A block preceded by
`<!-- not run: REASON -->` is not executed (its commands are still parsed); the count of such
blocks is pinned below, so a new one is a decision, not an accident.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from budgetproxy.cli import build_parser
from budgetproxy.cli import main as cli_main
from budgetproxy.config import Config, load_config
from budgetproxy.serve.server import ProxyServer
from budgetproxy.testing import FakeUpstream

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHOWN = "http://127.0.0.1:8080"
_BLOCK = re.compile(r"(?:^<!-- not run: (?P<reason>[^\n]*?) -->\n)?^```(?P<lang>\w*)\n"
                    r"(?P<body>.*?)^```", re.S | re.M)
_SECTIONS = set(Config.model_fields)
_RUN = {"python", "bash", "yaml", "toml"}
_SHELL_BREAK = {"&&", "||", "|", ";", "&", ">", ">>", "<", "2>", "2>&1"}
# Blocks marked "not run" across README.md and docs/ (each with its reason in the page).
NOT_RUN = 16


@dataclass(frozen=True)
class Block:
    page: str
    index: int
    lang: str
    body: str
    not_run: str | None  # the reason, when marked

    @property
    def where(self) -> str:
        return f"{self.page} block {self.index} ({self.lang or 'text'})"


def page_blocks(page: Path) -> list[Block]:
    return [Block(page.name, i, m["lang"], m["body"], m["reason"])
            for i, m in enumerate(_BLOCK.finditer(page.read_text(encoding="utf-8")))]


ALL = [b for page in PAGES for b in page_blocks(page)]


def commands(script: str) -> Iterator[list[str]]:
    """Each `budgetproxy ...` command of a shell script, as its argument list."""
    for line in script.replace("\\\n", " ").splitlines():
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            continue
        current: list[str] | None = None
        for token in [*tokens, ";"]:
            if token in _SHELL_BREAK:
                if current:
                    yield current
                current = None
            elif current is not None:
                current.append(token)
            elif token == "budgetproxy":
                current = []


def parse_error(argv: list[str]) -> str | None:
    """What the real parser says about a command line, or None when it parses."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as e:
        if e.code not in (0, None):
            return err.getvalue().strip() or f"exit {e.code}"
    return None


@dataclass
class Site:
    url: str
    work: Path


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """A proxy on an ephemeral port in front of the fake upstream, logging to ./trajectories
    of a folder that also holds the README's config as ./budgetproxy.yaml."""
    work = tmp_path_factory.mktemp("pages")
    readme_config = next(b.body for b in ALL if b.page == "README.md" and b.lang == "yaml")
    (work / "budgetproxy.yaml").write_text(readme_config)
    up = FakeUpstream(models=["my-model", "m1", "fake-model"]).start()
    server = ProxyServer(load_config(None, {
        "upstreams": [{"base_url": up.base_url}],
        "trajectories": {"dir": str(work / "trajectories")}, "metrics": {"enabled": False},
    })).start()
    # one finished episode with a task, so pages that read the log find one
    with httpx.Client(base_url=server.url, timeout=20) as http:
        made = http.post("/v1/episodes", json={"task_id": "seed", "budget": 2}).json()
        http.post("/v1/chat/completions", headers={"X-Episode-Id": made["episode_id"]},
                  json={"model": "my-model", "messages": [{"role": "user", "content": "hi"}]})
        http.post(f"/v1/episodes/{made['episode_id']}/outcome", json={"success": True})
    yield Site(server.url, work)
    server.stop()
    up.stop()


def _bash(block: Block, site: Site) -> None:
    script = block.body.replace(SHOWN, site.url)
    prelude = (f'budgetproxy() {{ {shlex.quote(sys.executable)} -m budgetproxy "$@"; }}\n'
               'curl() { command curl -f "$@"; }\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", prelude + script], cwd=site.work,
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, (block.where, script, done.stdout[-2000:], done.stderr[-2000:])


def _python(block: Block, site: Site, namespace: dict[str, Any]) -> None:
    code = block.body.replace(SHOWN, site.url)
    exec(compile(code, block.where, "exec"), namespace)


def _yaml(block: Block, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    loaded = yaml.safe_load(block.body)
    assert isinstance(loaded, dict) and set(loaded) <= _SECTIONS, (
        f"{block.where}: not a config; mark it <!-- not run: ... --> if it is another file")
    path = tmp_path / f"{block.page}-{block.index}.yaml"
    path.write_text(block.body)
    argv = ["serve", "--config", str(path), "--check"]
    if "upstreams" not in loaded:  # a fragment: the rest from a flag, as a reader would
        argv += ["--upstream", "http://127.0.0.1:9/v1"]
    capsys.readouterr()
    code = cli_main(argv)
    assert code == 0, (block.where, capsys.readouterr().err)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_block_of_the_page_runs_as_written(
    page: Path, site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(site.work)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # datasets' cache, off the home dir
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    namespace: dict[str, Any] = {"__name__": "__doc_block__"}
    for block in page_blocks(page):
        if block.lang == "bash":
            for argv in commands(block.body):
                error = parse_error(argv)
                assert error is None, (block.where, "budgetproxy " + " ".join(argv), error)
        if block.not_run is not None:
            assert block.not_run.strip(), f"{block.where}: say why it is not run"
            continue
        if block.lang == "python":
            _python(block, site, namespace)
        elif block.lang == "bash":
            _bash(block, site)
        elif block.lang == "yaml":
            _yaml(block, tmp_path, capsys)
        elif block.lang == "toml":
            tomllib.loads(block.body)
        else:
            assert block.lang in ("", "text"), (
                f"{block.where}: a {block.lang} block is neither run nor marked "
                "<!-- not run: REASON -->")


def test_the_blocks_not_run_are_counted() -> None:
    marked = [f"{b.where}: {b.not_run}" for b in ALL if b.not_run is not None]
    ran = [b for b in ALL if b.not_run is None and b.lang in _RUN]
    assert len(marked) == NOT_RUN, "\n".join(marked)
    assert len(ran) >= 20, len(ran)  # (most blocks run)


def test_the_command_parser_catches_a_wrong_flag() -> None:
    (argv,) = commands("budgetproxy analyze ./t --compare-with x > out.json  # a typo")
    assert argv == ["analyze", "./t", "--compare-with", "x"]
    assert parse_error(argv) is not None
    assert parse_error(["serve", "--config", "c.yaml", "--check"]) is None
    assert list(commands("pip install . && budgetproxy demo --out d")) == [["demo", "--out", "d"]]
