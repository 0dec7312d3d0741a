"""The README and docs/ as a new user reads them: links resolve, configs load and show every
key (test_code_blocks.py runs the code blocks)."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from budgetproxy.config import Config, ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_SECTIONS = set(Config.model_fields)


def blocks(page: Path, lang: str) -> list[str]:
    return [body for kind, body in _FENCE.findall(page.read_text(encoding="utf-8"))
            if kind == lang]


def slug(heading: str) -> str:
    """A heading's anchor as code hosts write it (GitHub's rules)."""
    text = unicodedata.normalize("NFKC", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def test_docs_exist_for_every_topic() -> None:
    names = {p.name for p in PAGES}
    for topic in ("configuration", "episodes", "disclosure", "trajectories", "analysis",
                  "metrics", "deployment", "performance", "apis", "agents", "security"):
        assert f"{topic}.md" in names, topic


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto: — not checked offline
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: {target} does not exist"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{page.name}: no heading #{anchor} in {dest.name}"


def _config_blocks() -> Iterator[tuple[str, str]]:
    for page in PAGES:
        for i, body in enumerate(blocks(page, "yaml")):
            loaded = yaml.safe_load(body)
            if isinstance(loaded, dict) and set(loaded) <= _SECTIONS:
                yield f"{page.name}#{i}", body


@pytest.mark.parametrize(("where", "body"), list(_config_blocks()), ids=lambda v: v
                         if "#" in str(v) else "")
def test_every_config_block_loads(where: str, body: str, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(body)
    try:
        load_config(path, environ={})
    except ConfigError as e:
        pytest.fail(f"{where}: {e}")


def _keys(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    for name, field in model.model_fields.items():
        inner = [a for a in (field.annotation, *getattr(field.annotation, "__args__", ()))
                 if isinstance(a, type) and issubclass(a, BaseModel)]
        if inner:
            yield from _keys(inner[0], f"{prefix}{name}.")
        else:
            yield prefix + name


def _present(data: Any, key: list[str]) -> bool:
    if not key:
        return True
    if isinstance(data, list):  # an empty default list shows no entry to look into
        return not data or any(_present(item, key) for item in data)
    if data == {}:  # nor does an empty mapping of entries (prices by model glob)
        return True
    return isinstance(data, dict) and key[0] in data and _present(data[key[0]], key[1:])


def test_the_configuration_page_shows_every_key_with_its_default(tmp_path: Path) -> None:
    page = REPO / "docs" / "configuration.md"
    full = max(blocks(page, "yaml"), key=len)
    shown = yaml.safe_load(full)
    missing = [k for k in _keys(Config) if not _present(shown, k.split("."))]
    assert not missing, f"docs/configuration.md lacks {missing}"
    path = tmp_path / "full.yaml"
    path.write_text(full)
    loaded = load_config(path, environ={}).model_dump(exclude={"upstreams"})
    assert loaded == Config().model_dump(exclude={"upstreams"}), "shown values must be defaults"


CLIENTS = ("Codex CLI", "Claude Code", "inspect-ai", "Agents SDK", "LangChain", "anthropic")


def test_the_readme_sends_each_client_to_the_page_that_covers_it() -> None:
    """A README paragraph or table row naming clients and linking the client pages (agents,
    apis): each client it names is covered on a page it links."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    checked = 0
    for part in re.split(r"\n\n|\n(?=\|)", _FENCE.sub("", readme)):
        named = [c for c in CLIENTS if c in part]
        pages = [REPO / t.partition("#")[0] for t in _LINK.findall(part)
                 if t.partition("#")[0] in ("docs/agents.md", "docs/apis.md")]
        if not named or not pages:
            continue
        text = " ".join(p.read_text(encoding="utf-8") for p in pages)
        missing = [c for c in named if c not in text]
        assert not missing, f"{part.strip()[:120]!r}: {missing} not on {[p.name for p in pages]}"
        checked += 1
    assert checked >= 2


def test_the_architecture_map_names_files_and_functions_that_exist() -> None:
    """docs/architecture.md names the package's files, functions and classes: each file it
    names exists, each name given right after a file is defined in that file, each
    `Class.member` is defined in the file of that class, and each private `_function` is
    defined in the package. A rename the map does not follow fails here, naming it."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    pkg = REPO / "budgetproxy"
    sources = {p.relative_to(pkg).as_posix(): p.read_text(encoding="utf-8")
               for p in pkg.rglob("*.py")}

    def defines(src: str, name: str) -> bool:
        return re.search(rf"^\s*(?:async def|def|class) {name}\b|^\s*{name}\s*[:=]"
                         rf"|self\.{name}\s*[:=]", src, re.M) is not None

    wrong = []
    for path in re.findall(r"`((?:\w+/)+[\w.]+\.(?:py|lua))`", text):
        if not ((REPO if path.startswith(("tests/", "bench/")) else pkg) / path).exists():
            wrong.append(f"no file {path}")
    for path, names in re.findall(r"`((?:\w+/)+\w+\.py)`((?: `[\w.]+`)+)", text):
        src = sources.get(path)
        for name in re.findall(r"`([\w.]+)`", names):
            if src is not None and not defines(src, name.split(".")[-1]):
                wrong.append(f"{path} defines no {name}")
    for cls, member in set(re.findall(r"`([A-Z]\w*)\.(\w+)`", text)):
        homes = [src for src in sources.values() if re.search(rf"^class {cls}\b", src, re.M)]
        if not any(defines(src, member) for src in homes):
            wrong.append(f"no {cls}.{member}")
    for name in set(re.findall(r"`(_[a-z]\w*)`", text)):
        if not any(re.search(rf"^\s*(?:async )?def {name}\b", src, re.M)
                   for src in sources.values()):
            wrong.append(f"no function {name}")
    assert not wrong, "docs/architecture.md is out of date: " + "; ".join(sorted(wrong))
