"""The README's figure: the demo report's Pass@(K,T) curves, rendered to PNG by headless Chromium.

`figure_data` keeps what the figure is drawn from (the Pass@(K,T) cells of a run's
``pass_at.json``, the claims' paired differences and the run's settings); `figure_page`
draws it with the report's own chart code, as a page of fixed size; `render_png` has Chromium
take its screenshot and writes into the PNG the SHA-256 of the page it drew, so a test can tell
whether a committed PNG is the drawing of its committed data by the current code.

    python -m budgetproxy.demo.figure DATA.json FIGURE.png   # draw FIGURE.png from DATA.json
"""

from __future__ import annotations

import hashlib
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Mapping, Sequence
from fractions import Fraction
from html import escape
from pathlib import Path
from typing import Any

FIGURE_K = (1, 8)
SOURCE_KEY = "budgetproxy-figure-source-sha256"
GAP, PAD, HEAD = 16, 12, 30  # px between charts, around them, for the title line
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--force-device-scale-factor=1")  # fmt: skip


def figure_data(analysis: Mapping[str, Any]) -> dict[str, Any]:
    """From a demo's ``pass_at.json``: the settings, the episode counts, the cells at
    FIGURE_K, and the K=1 paired differences the printed claims cite (main and token arm)."""

    def claims(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        keep = ("field", "a", "b", "k", "tier", "by", "diff", "ci_low", "ci_high", "n_tasks",
                "ci_note", "excludes_zero")  # fmt: skip
        return [{k: r.get(k) for k in keep} for r in rows
                if r.get("k") == 1 and r.get("diff") is not None]  # fmt: skip

    token = analysis.get("token_arm") or {}
    return {
        "settings": analysis.get("settings"),
        "episodes": analysis.get("episodes"),
        "pass_at": [c for c in analysis.get("pass_at", []) if c.get("k") in FIGURE_K],
        "compare": claims(analysis.get("compare", [])),
        "token_arm": {"compare": claims(token.get("compare", []))},
    }


def _cells(data: Mapping[str, Any]) -> list[Any]:
    from budgetproxy.analysis.table import Budget, Cell

    cells = []
    for c in data["pass_at"]:
        if "tier" not in c:
            continue
        budget = Budget("tier", Fraction(str(c["tier"]).rstrip("%")))
        cells.append(Cell(
            int(c["k"]), budget, tuple((str(k), v) for k, v in c["by"].items()), c["value"],
            c["ci_low"], c["ci_high"], int(c["n_tasks"]), int(c["n_tasks_left_out"]),
            int(c["n_episodes"]), int(c["n_tasks"]) + int(c["n_tasks_left_out"]),
            int(c["n_episodes"]), c.get("ci_note"),
        ))  # fmt: skip
    return cells


def _svg_size(svg: str) -> tuple[int, int]:
    m = re.search(r'width="(\d+)" height="(\d+)"', svg)
    if m is None:
        raise ValueError("a chart without its size")
    return int(m.group(1)), int(m.group(2))


def figure_page(data: Mapping[str, Any]) -> tuple[str, tuple[int, int]]:
    """The figure as a page and the window size that shows all of it: the report's Pass@(K,T)
    charts at FIGURE_K side by side, at their own size, under one line saying what run it is."""
    from budgetproxy.analysis.report import pass_curves
    from budgetproxy.analysis.svg import PALETTE

    cells = _cells(data)
    names = list(dict.fromkeys(" · ".join("-" if v is None else v for _, v in c.by)
                               for c in cells))  # fmt: skip
    colors = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}
    svgs = [f[f.index("<svg"):f.rindex("</svg>") + 6] for f in pass_curves(cells, colors)]
    sizes = [_svg_size(s) for s in svgs]
    width = sum(w for w, _ in sizes) + GAP * (len(sizes) - 1) + 2 * PAD
    height = max(h for _, h in sizes) + HEAD + 2 * PAD
    settings, episodes = data.get("settings") or {}, data.get("episodes") or {}
    tasks = max((int(c["n_tasks"]) for c in data["pass_at"] if c.get("k") == 1), default=0)
    title = (f"budgetproxy demo (seed {settings.get('seed')}): Pass@(K,T) by policy and arm, "
             f"{tasks} FrozenLake maps, {episodes.get('used', 0):,} episodes, with 95% "
             "bootstrap intervals over maps")  # fmt: skip
    body = "".join(f"<div>{s}</div>" for s in svgs)
    page = (
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>budgetproxy demo figure"
        "</title><style>body { font: 14px/1.45 system-ui, sans-serif; color: #222; } "
        f"body {{ margin: 0; padding: {PAD}px; max-width: none; "
        f"width: {width - 2 * PAD}px; background: #fff; }} .row {{ display: flex; gap: {GAP}px; "
        f"}} p {{ margin: 0 0 8px; height: {HEAD - 8}px; font-size: 14px; }}</style></head>"
        f"<body><p>{escape(title)}</p><div class=row>{body}</div></body></html>\n"
    )
    return page, (width, height)


def source_digest(page: str) -> str:
    return hashlib.sha256(page.encode("utf-8")).hexdigest()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def with_text(png: bytes, key: str, text: str) -> bytes:
    """The PNG with a tEXt chunk `key`=`text` right after its header chunk."""
    if not png.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError("not a PNG")
    end = 8 + 8 + struct.unpack(">I", png[8:12])[0] + 4  # signature, IHDR
    return png[:end] + _chunk(b"tEXt", key.encode("latin-1") + b"\0" + text.encode("latin-1")) \
        + png[end:]


def png_text(png: bytes) -> dict[str, str]:
    """The tEXt chunks of a PNG."""
    out, at = {}, 8
    while at + 8 <= len(png):
        size = struct.unpack(">I", png[at:at + 4])[0]
        kind, data = png[at + 4:at + 8], png[at + 8:at + 8 + size]
        if kind == b"tEXt":
            key, _, value = data.partition(b"\0")
            out[key.decode("latin-1")] = value.decode("latin-1")
        at += 12 + size
    return out


def png_size(png: bytes) -> tuple[int, int]:
    width, height = struct.unpack(">II", png[16:24])
    return int(width), int(height)


NO_CHROMIUM = ("the figure is drawn by headless Chromium, which is not installed "
               "(Debian: apt-get install chromium)")


def find_chromium() -> str | None:
    """The Chromium binary on PATH, or None."""
    for name in ("chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    return None


def chromium() -> str:
    if path := find_chromium():
        return path
    raise RuntimeError(NO_CHROMIUM)


def render_png(page: str, size: tuple[int, int], out: Path) -> None:
    """Screenshot `page` at `size` in a fresh headless Chromium; write it to `out`, tagged with
    the page's digest."""
    with tempfile.TemporaryDirectory(prefix="budgetproxy-figure-") as tmp:
        html, shot = Path(tmp) / "figure.html", Path(tmp) / "figure.png"
        html.write_text(page, encoding="utf-8")
        subprocess.run(
            [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp}/profile",
             f"--window-size={size[0]},{size[1]}", f"--screenshot={shot}", html.as_uri()],
            check=True, capture_output=True, timeout=120)  # fmt: skip
        png = shot.read_bytes()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(with_text(png, SOURCE_KEY, source_digest(page)))


def write_figure(analysis: Mapping[str, Any], png: Path) -> Path:
    """Write `png` and, beside it, the data it is drawn from (same name, .json)."""
    import json

    data = figure_data(analysis)
    data_file = png.with_suffix(".json")
    data_file.parent.mkdir(parents=True, exist_ok=True)
    data_file.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    render_png(*figure_page(data), png)
    return data_file


def main(argv: Sequence[str] | None = None) -> int:
    import json

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    data = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    render_png(*figure_page(data), Path(args[1]))
    print(f"wrote {args[1]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
