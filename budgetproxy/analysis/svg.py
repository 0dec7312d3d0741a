"""Small inline-SVG charts (line with CI band, grouped bars) for the HTML report."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

# Okabe–Ito: distinguishable with the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 34, 44
LEGEND_CHARS = 36  # longer series names are cut
FONT = 'font-family="system-ui, sans-serif" font-size="11"'


@dataclass(frozen=True)
class Series:
    """One named line or bar set; None is a missing point."""

    name: str
    values: Sequence[float | None]
    low: Sequence[float | None] | None = None
    high: Sequence[float | None] | None = None


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 × 10^n that is ≥ value (a clean axis end)."""
    if value <= 0:
        return 1.0
    base = 10 ** math.floor(math.log10(value))
    return float(next(m * base for m in (1, 2, 2.5, 5, 10) if m * base >= value * (1 - 1e-9)))


class _Frame:
    """Plot area geometry, axes, ticks, title and legend shared by both chart kinds."""

    def __init__(
        self,
        title: str,
        x_labels: Sequence[str],
        names: Sequence[str],
        y_max: float,
        percent: bool,
        width: int,
        height: int,
    ) -> None:
        self.x_labels, self.names, self.y_max, self.percent = list(x_labels), names, y_max, percent
        # the legend sits right of the plot and is as wide as its longest name (~6.5 px a char)
        longest = max((len(n[:LEGEND_CHARS]) for n in names), default=0)
        width += 34 + round(6.5 * longest)
        self.width, self.height = width, height
        self.pw = width - LEFT - RIGHT - (34 + round(6.5 * longest))
        self.ph = height - TOP - BOTTOM
        self.parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
            f'width="{width}" height="{height}" role="img" aria-label="{escape(title)}" {FONT}>',
            f'<text x="{LEFT}" y="18" font-size="13" font-weight="600">{escape(title)}</text>',
        ]

    def value(self, v: float) -> str:
        return f"{100 * v:.1f}%" if self.percent else f"{v:g}"

    def x(self, i: float) -> float:
        return LEFT + (i + 0.5) * self.pw / max(1, len(self.x_labels))

    def y(self, v: float) -> float:
        return TOP + self.ph * (1 - min(max(v / self.y_max, 0.0), 1.0))

    def axes(self, x_title: str, y_title: str) -> None:
        p = self.parts
        for k in range(5):
            v = self.y_max * k / 4
            y = self.y(v)
            label = f"{100 * v:g}%" if self.percent else f"{v:g}"
            p.append(
                f'<line x1="{LEFT}" x2="{LEFT + self.pw}" y1="{y:.1f}" y2="{y:.1f}" '
                f'stroke="#e4e4e4"/>'
            )
            p.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
        every = max(1, math.ceil(len(self.x_labels) / 12))
        for i, label in enumerate(self.x_labels):
            if i % every == 0:
                p.append(
                    f'<text x="{self.x(i):.1f}" y="{TOP + self.ph + 16}" '
                    f'text-anchor="middle">{escape(label)}</text>'
                )
        bottom = TOP + self.ph
        p.append(
            f'<line x1="{LEFT}" x2="{LEFT + self.pw}" y1="{bottom}" y2="{bottom}" '
            f'stroke="#333"/><line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{bottom}" '
            f'stroke="#333"/>'
        )
        p.append(
            f'<text x="{LEFT + self.pw / 2:.1f}" y="{self.height - 8}" '
            f'text-anchor="middle">{escape(x_title)}</text>'
        )
        p.append(
            f'<text transform="translate(13 {TOP + self.ph / 2:.1f}) rotate(-90)" '
            f'text-anchor="middle">{escape(y_title)}</text>'
        )

    def done(self) -> str:
        x0 = LEFT + self.pw + 16
        for i, name in enumerate(self.names):
            y = TOP + 8 + 18 * i
            self.parts.append(
                f'<rect x="{x0}" y="{y - 8}" width="12" height="12" '
                f'fill="{PALETTE[i % len(PALETTE)]}"/><text x="{x0 + 18}" y="{y + 2}">'
                f"{escape(name[:LEGEND_CHARS])}</text>"
            )
        return "\n".join([*self.parts, "</svg>"])


def _runs(values: Sequence[float | None]) -> list[list[int]]:
    """Indices of the stretches without missing values: lines break where data is missing."""
    runs: list[list[int]] = [[]]
    for i, v in enumerate(values):
        if v is None:
            runs.append([])
        else:
            runs[-1].append(i)
    return [r for r in runs if r]


def line_chart(
    title: str,
    x_labels: Sequence[str],
    series: Sequence[Series],
    *,
    x_title: str,
    y_title: str,
    y_max: float | None = None,
    percent: bool = True,
    width: int = 400,
    height: int = 300,
) -> str:
    """Lines over categorical x, with a shaded band where a series has low/high bounds."""
    top = y_max or nice_ceiling(
        max([v for s in series for v in [*s.values, *(s.high or [])] if v is not None] or [1.0])
    )
    f = _Frame(title, x_labels, [s.name for s in series], top, percent, width, height)
    f.axes(x_title, y_title)
    for n, s in enumerate(series):
        color = PALETTE[n % len(PALETTE)]
        if s.low is not None and s.high is not None:
            low, high = s.low, s.high
            bounded = [lo if hi is not None else None for lo, hi in zip(low, high, strict=True)]
            for run in _runs(bounded):
                ring = [f"{f.x(i):.1f},{f.y(high[i] or 0):.1f}" for i in run]
                ring += [f"{f.x(i):.1f},{f.y(low[i] or 0):.1f}" for i in reversed(run)]
                f.parts.append(
                    f'<polygon points="{" ".join(ring)}" fill="{color}" '
                    f'fill-opacity="0.15" stroke="none"/>'
                )
        for run in _runs(s.values):
            path = " ".join(f"{f.x(i):.1f},{f.y(s.values[i] or 0):.1f}" for i in run)
            f.parts.append(
                f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>'
            )
        if len(s.values) <= 12:
            f.parts += [
                f'<circle cx="{f.x(i):.1f}" cy="{f.y(v):.1f}" r="3" fill="{color}">'
                f"<title>{escape(s.name)}: {escape(f.x_labels[i])}, {f.value(v)}</title></circle>"
                for i, v in enumerate(s.values)
                if v is not None
            ]
    return f.done()


def bar_chart(
    title: str,
    x_labels: Sequence[str],
    series: Sequence[Series],
    *,
    x_title: str,
    y_title: str,
    y_max: float | None = None,
    percent: bool = True,
    width: int = 400,
    height: int = 300,
) -> str:
    """Grouped bars: one group per x label, one bar per series."""
    top = y_max or nice_ceiling(
        max([v for s in series for v in s.values if v is not None] or [1.0])
    )
    f = _Frame(title, x_labels, [s.name for s in series], top, percent, width, height)
    f.axes(x_title, y_title)
    slot = f.pw / max(1, len(x_labels))
    bar = slot * 0.8 / max(1, len(series))
    for n, s in enumerate(series):
        color = PALETTE[n % len(PALETTE)]
        for i, v in enumerate(s.values):
            if v is None:
                continue
            x = LEFT + i * slot + slot * 0.1 + n * bar
            y = f.y(v)
            label = f"{x_labels[i]}, {s.name}: {f.value(v)}"
            f.parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" '
                f'height="{TOP + f.ph - y:.1f}" fill="{color}">'
                f"<title>{escape(label)}</title></rect>"
            )
    return f.done()
