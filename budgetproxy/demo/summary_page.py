"""'What this demo shows' as a section of the report: each claim a card, not a text dump.

Built from the lines `summary.what_this_shows` and `summary.token_claim` print, whose shape is
fixed there: a heading line; claims that start "- Title. "; lines under a claim indented by two
spaces; the BudgetMix block, a heading and one indented line per task.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

STYLE = """
.claims { display: grid; grid-template-columns: repeat(auto-fill, minmax(420px, 1fr));
          gap: 14px 20px; margin: 10px 0; }
.claim { border: 1px solid #ddd; border-radius: 6px; padding: 4px 14px 8px; }
.claim h3 { font-size: 15px; margin: 8px 0 4px; }
.claim p, .claim li { margin: 4px 0; }
.claim ul { padding-left: 18px; margin: 4px 0; }
.claim td, .claim th { text-align: left; }
.ci { font-variant-numeric: tabular-nums; white-space: nowrap; }
.ci.sig { font-weight: 600; color: #0b5cad; }
"""

# "+0.18 [+0.04, +0.35]", optionally starred; or "+0.06 (zero width: ...)"
_CI = re.compile(r"[+-]\d+\.\d\d (?:\[[+-]\d+\.\d\d, [+-]\d+\.\d\d\]|\([^)]*\))( \*)?")


@dataclass
class Claim:
    title: str
    lead: str = ""
    lines: list[str] = field(default_factory=list)
    rows: list[tuple[str, str]] = field(default_factory=list)  # BudgetMix: task, groups


def _numbers(text: str) -> str:
    """Escaped text with each interval marked up; a starred one (excludes 0) stands out."""
    out, at = [], 0
    for m in _CI.finditer(text):
        out.append(escape(text[at:m.start()]))
        sig = " sig" if m.group(1) else ""
        out.append(f"<span class='ci{sig}'>{escape(m.group(0))}</span>")
        at = m.end()
    out.append(escape(text[at:]))
    return "".join(out)


def parse(lines: Sequence[str]) -> tuple[str, list[Claim]]:
    """The heading line and the claims, in order."""
    heading, claims = "", []
    for line in lines:
        if line.startswith("- "):
            title, _, rest = line[2:].partition(". ")
            claims.append(Claim(title, rest))
        elif line.startswith("BudgetMix groups"):
            title, _, rest = line.partition(" (")
            claims.append(Claim(title, "(" + rest.rstrip(":")))
        elif line.startswith("  ") and claims:
            text = line.strip()
            task, sep, groups = text.partition(": ")
            if claims[-1].title == "BudgetMix groups" and sep:
                claims[-1].rows.append((task, groups))
            else:
                claims[-1].lines.append(text)
        elif not claims and not heading:
            heading = line
        elif claims:
            claims[-1].lines.append(line.strip())
    return heading, claims


def _lead(text: str) -> str:
    """A claim's first sentence; a list of per-tier or per-K values becomes a list."""
    head, sep, values = text.partition("): ")
    parts = [p for p in values.rstrip(".").split("; ") if p]
    if sep and len(parts) > 1:
        items = "".join(f"<li>{_numbers(p)}</li>" for p in parts)
        return f"<p>{_numbers(head + '):')}</p><ul>{items}</ul>"
    return f"<p>{_numbers(text)}</p>"


def _line(text: str) -> str:
    head, sep, rest = text.partition(": ")
    if text.startswith("At larger K") and sep:
        items = "".join(f"<li>{_numbers(p)}</li>" for p in rest.rstrip(".").split("; "))
        return f"<p>{escape(head)}:</p><ul>{items}</ul>"
    return f"<p>{_numbers(text)}</p>"


def summary_section(lines: Sequence[str]) -> str:
    """The report's "What this demo shows" section."""
    heading, claims = parse(lines)
    cards = []
    for c in claims:
        body = [_lead(c.lead)] if c.lead else []
        body += [_line(t) for t in c.lines]
        if c.rows:
            rows = "".join(f"<tr><td>{escape(t)}</td><td>{escape(g)}</td></tr>"
                           for t, g in c.rows)  # fmt: skip
            body.append("<table><tr><th>task</th><th>each group: its drawn budget (tier), "
                        f"successes</th></tr>{rows}</table>")  # fmt: skip
        cards.append(f"<div class=claim><h3>{escape(c.title)}</h3>{''.join(body)}</div>")
    note = f"<p class=muted>{_numbers(heading)}</p>" if heading else ""
    return (f"<h2>What this demo shows</h2><style>{STYLE}</style>{note}"
            f"<div class=claims>{''.join(cards)}</div>")
