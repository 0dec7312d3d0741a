"""Small inline-SVG charts (lines with CI, grouped bars) for the HTML report."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

# Okabe–Ito: distinguishable with the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
WIDTH, HEIGHT = 640, 340  # nominal; the page scales charts to its columns
RIGHT, TITLE_H, LINE_H = 16, 38, 17
CHAR_PX = 6.6  # a generous mean glyph width at 11 px, so estimated text never overlaps
LEGEND_CHARS = 36  # longer series names are cut
BAND_MAX_SERIES = 2  # with more series, CI bands overlap into mud: draw whiskers instead
MAX_DOTS = 30  # above this many points a line gets no dots
FONT = 'font-family="system-ui, sans-serif" font-size="11"'


@dataclass(frozen=True)
class Series:
    """One named line or bar set; None is a missing point. `color` overrides the palette, so
    a slice keeps its colour across charts."""

    name: str
    values: Sequence[float | None]
    low: Sequence[float | None] | None = None
    high: Sequence[float | None] | None = None
    color: str | None = None
    tips: Sequence[str | None] | None = None  # more words for a point's hover text
    counts: Sequence[str | None] | None = None  # bar charts: a short count over each bar
    hatched: Sequence[bool] | None = None  # bar charts: bars drawn hatched (e.g. one task)

    def tip(self, i: int) -> str:
        extra = self.tips[i] if self.tips is not None else None
        return f" ({extra})" if extra else ""

    @property
    def has_data(self) -> bool:
        return any(v is not None for v in self.values)


def text_width(text: str) -> float:
    return CHAR_PX * len(text)


def nice_ticks(top: float, max_steps: int = 5) -> list[float]:
    """Ticks from 0 to a clean end ≥ top in at most `max_steps` steps of 1, 2 or 5 × 10^n."""
    if not top > 0:
        top = 1.0
    exp = math.floor(math.log10(top / max_steps))
    for step in (m * 10.0**e for e in (exp, exp + 1) for m in (1, 2, 5)):
        steps = math.ceil(top / step - 1e-9)
        if steps <= max_steps:
            return [round(step * i, 12) for i in range(steps + 1)]
    raise AssertionError("unreachable: 10^(exp+1) ≥ top / max_steps")


def _tick_label(value: float, step: float, percent: bool) -> str:
    scale = 100.0 if percent else 1.0
    decimals = max(0, -math.floor(math.log10(step * scale) + 1e-9))
    return f"{value * scale:.{decimals}f}" + ("%" if percent else "")


def ci_mark(series: Sequence[Series]) -> str:
    """How `line_chart` draws these series' intervals, for captions. Counted over every series
    given, with data or not, so charts of the same slices draw them alike."""
    bounded = [s for s in series if s.low is not None]
    return "shaded bands" if len(bounded) <= BAND_MAX_SERIES else "whiskers"


class _Frame:
    """Geometry, axes, title and legend shared by both chart kinds. The y ticks are clean
    numbers, the margin left of the plot fits the widest tick label plus the axis title, the
    legend sits above the plot and x labels turn 45° (or thin out) when they would collide."""

    def __init__(
        self,
        title: str,
        x_labels: Sequence[str],
        series: Sequence[Series],
        top: float,
        percent: bool,
        width: int,
        height: int,
    ) -> None:
        self.x_labels, self.percent, self.width = list(x_labels), percent, width
        self.patterns: set[str] = set()
        self.ticks = nice_ticks(top)
        self.y_max = self.ticks[-1]
        step = self.ticks[1] - self.ticks[0] if len(self.ticks) > 1 else 1.0
        self.tick_labels = [_tick_label(v, step, percent) for v in self.ticks]
        self.left = 30 + round(max(text_width(t) for t in self.tick_labels))
        self.pw = width - self.left - RIGHT
        self.legend = self._legend(series)
        self.top = TITLE_H + LINE_H * (1 + max((row for row, *_ in self.legend), default=-1)) + 12
        self.slot = self.pw / max(1, len(self.x_labels))
        widest = max((text_width(t) for t in self.x_labels), default=0.0)
        self.rotate = widest + 8 > self.slot and self.slot >= 16 and len(self.x_labels) <= 30
        fit = 16 if self.rotate else widest + 8
        self.every = max(1, math.ceil(fit / self.slot))
        depth = widest * 0.71 + 14 if self.rotate else 16.0
        self.ph = height - TITLE_H - LINE_H - 12 - 16 - 30  # as if one legend row, flat labels
        self.height = round(self.top + self.ph + depth + 30)
        self.parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {self.height}" '
            f'width="{width}" height="{self.height}" role="img" aria-label="{escape(title)}" '
            f"{FONT}>",
            f'<text x="{self.left}" y="18" font-size="13" font-weight="600">{escape(title)}</text>',
        ]

    def _legend(self, series: Sequence[Series]) -> list[tuple[int, float, str, str]]:
        """(row, x, colour, name) of each series with data, flowing left to right."""
        items, row, x = [], 0, float(self.left)
        for i, s in enumerate(series):
            if not s.has_data:
                continue
            name = s.name[:LEGEND_CHARS]
            w = 18 + text_width(name) + 14
            if x > self.left and x + w > self.width - RIGHT:
                row, x = row + 1, float(self.left)
            items.append((row, x, color_of(s, i), name))
            x += w
        return items

    def value(self, v: float) -> str:
        return f"{100 * v:.1f}%" if self.percent else f"{v:g}"

    def x(self, i: float) -> float:
        return self.left + (i + 0.5) * self.slot

    def y(self, v: float) -> float:
        return self.top + self.ph * (1 - min(max(v / self.y_max, 0.0), 1.0))

    def axes(self, x_title: str, y_title: str) -> None:
        p = self.parts
        right, bottom = self.left + self.pw, self.top + self.ph
        for v, label in zip(self.ticks, self.tick_labels, strict=True):
            y = self.y(v)
            p.append(f'<line x1="{self.left}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="#e4e4e4"/>')  # fmt: skip
            p.append(f'<text x="{self.left - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
        for i, label in enumerate(self.x_labels):
            if i % self.every:
                continue
            if self.rotate:
                p.append(
                    f'<text transform="translate({self.x(i) + 3:.1f} {bottom + 12}) rotate(-45)" '
                    f'text-anchor="end">{escape(label)}</text>'
                )
            else:
                p.append(f'<text x="{self.x(i):.1f}" y="{bottom + 16}" '
                         f'text-anchor="middle">{escape(label)}</text>')  # fmt: skip
        p.append(
            f'<line x1="{self.left}" x2="{right}" y1="{bottom}" y2="{bottom}" stroke="#333"/>'
            f'<line x1="{self.left}" x2="{self.left}" y1="{self.top}" y2="{bottom}" '
            f'stroke="#333"/>'
        )
        p.append(f'<text x="{self.left + self.pw / 2:.1f}" y="{self.height - 9}" '
                 f'text-anchor="middle">{escape(x_title)}</text>')  # fmt: skip
        # the rotated title's glyphs span about x = 3..14, clear of the tick labels' left end
        p.append(
            f'<text transform="translate(14 {self.top + self.ph / 2:.1f}) rotate(-90)" '
            f'text-anchor="middle">{escape(y_title)}</text>'
        )

    def hatch(self, color: str) -> str:
        """The fill of a hatched bar in `color`; its pattern is defined once per chart. Charts
        on one page share ids, so a pattern's id names its colour and every copy is alike."""
        pid = "hatch-" + "".join(ch for ch in color if ch.isalnum())
        if pid not in self.patterns:
            self.patterns.add(pid)
            self.parts.insert(1, (
                f'<defs><pattern id="{pid}" patternUnits="userSpaceOnUse" width="6" height="6" '
                f'patternTransform="rotate(45)"><rect width="6" height="6" fill="#fff"/>'
                f'<rect width="2.5" height="6" fill="{escape(color)}"/></pattern></defs>'))
        return f"url(#{pid})"

    def done(self) -> str:
        for row, x, color, name in self.legend:
            y = TITLE_H + LINE_H * row
            self.parts.append(
                f'<rect x="{x:.1f}" y="{y - 9}" width="12" height="12" fill="{color}"/>'
                f'<text x="{x + 18:.1f}" y="{y + 1}">{escape(name)}</text>'
            )
        return "\n".join([*self.parts, "</svg>"])


def color_of(series: Series, index: int) -> str:
    return series.color or PALETTE[index % len(PALETTE)]


def empty_chart(title: str, message: str, width: int = WIDTH, height: int = 120) -> str:
    """A titled box that says why there is nothing to plot."""
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{escape(title)}" {FONT}>\n'
        f'<text x="12" y="18" font-size="13" font-weight="600">{escape(title)}</text>\n'
        f'<rect x="12" y="30" width="{width - 24}" height="{height - 42}" fill="#fafafa" '
        f'stroke="#ddd" stroke-dasharray="4 3"/>\n'
        f'<text x="{width / 2:.1f}" y="{30 + (height - 42) / 2 + 4:.1f}" text-anchor="middle" '
        f'font-size="12" fill="#666">{escape(message)}</text>\n</svg>'
    )


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
    width: int = WIDTH,
    height: int = HEIGHT,
    empty: str = "no data",
) -> str:
    """Lines over categorical x with their CIs where a series has low/high bounds: shaded bands
    for up to BAND_MAX_SERIES series, else whiskers, the series nudged apart to stay legible."""
    if not any(s.has_data for s in series):
        return empty_chart(title, empty, width)
    top = y_max or max(v for s in series for v in [*s.values, *(s.high or [])] if v is not None)
    f = _Frame(title, x_labels, series, top, percent, width, height)
    f.axes(x_title, y_title)
    bands = ci_mark(series) == "shaded bands"
    shown = sum(1 for s in series if s.has_data)
    # Whiskers of curves that meet near 0 or 1 (large K) would stack into one line: spread
    # the series over up to 60% of a slot so each interval stays apart.
    nudge = 0.0 if bands else min(12.0, f.slot * 0.6 / shown)
    rank = 0
    for n, s in enumerate(series):
        if not s.has_data:
            continue
        color, dx = color_of(s, n), (rank - (shown - 1) / 2) * nudge
        rank += 1
        low, high = s.low, s.high
        if low is not None and high is not None:
            spans = [i for i, (lo, hi) in enumerate(zip(low, high, strict=True))
                     if lo is not None and hi is not None]  # fmt: skip
            if bands:
                for run in _runs([s.values[i] if i in spans else None for i in range(len(low))]):
                    ring = [f"{f.x(i):.1f},{f.y(high[i] or 0):.1f}" for i in run]
                    ring += [f"{f.x(i):.1f},{f.y(low[i] or 0):.1f}" for i in reversed(run)]
                    f.parts.append(f'<polygon points="{" ".join(ring)}" fill="{color}" '
                                   f'fill-opacity="0.12" stroke="none"/>')  # fmt: skip
            else:
                f.parts += [
                    f'<line x1="{f.x(i) + dx:.1f}" x2="{f.x(i) + dx:.1f}" '
                    f'y1="{f.y(low[i] or 0):.1f}" y2="{f.y(high[i] or 0):.1f}" stroke="{color}" '
                    f'stroke-width="1.5" stroke-opacity="0.55"/>'
                    for i in spans
                ]
        for run in _runs(s.values):
            path = " ".join(f"{f.x(i) + dx:.1f},{f.y(s.values[i] or 0):.1f}" for i in run)
            f.parts.append(
                f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>'
            )
        if len(s.values) > MAX_DOTS:
            continue
        for i, v in enumerate(s.values):
            if v is None:
                continue
            tip = f"{s.name}: {f.x_labels[i]}, {f.value(v)}"
            if low is not None and high is not None and low[i] is not None:
                tip += f" [{f.value(low[i] or 0)}, {f.value(high[i] or 0)}]"
            tip += s.tip(i)
            f.parts.append(f'<circle cx="{f.x(i) + dx:.1f}" cy="{f.y(v):.1f}" r="3" '
                           f'fill="{color}"><title>{escape(tip)}</title></circle>')  # fmt: skip
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
    width: int = WIDTH,
    height: int = HEIGHT,
    empty: str = "no data",
) -> str:
    """Grouped bars: one group per x label, one bar per series that has data."""
    shown = [(n, s) for n, s in enumerate(series) if s.has_data]
    if not shown:
        return empty_chart(title, empty, width)
    top = y_max or max(v for _, s in shown for v in s.values if v is not None)
    f = _Frame(title, x_labels, series, top, percent, width, height)
    f.axes(x_title, y_title)
    bar = f.slot * 0.8 / len(shown)
    for rank, (n, s) in enumerate(shown):
        for i, v in enumerate(s.values):
            if v is None:
                continue
            x = f.left + i * f.slot + f.slot * 0.1 + rank * bar
            y = min(f.y(v), f.top + f.ph - 1.5)  # a zero still shows, unlike a missing bar
            label = f"{x_labels[i]}, {s.name}: {f.value(v)}"
            low = s.low[i] if s.low is not None else None
            high = s.high[i] if s.high is not None else None
            if low is not None and high is not None:
                label += f" [{f.value(low)}, {f.value(high)}]"
            label += s.tip(i)
            color = color_of(s, n)
            paint = f'fill="{color}"'
            if s.hatched is not None and s.hatched[i]:
                paint = f'fill="{f.hatch(color)}" stroke="{color}" stroke-width="1"'
            f.parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" '
                f'height="{f.top + f.ph - y:.1f}" {paint}>'
                f"<title>{escape(label)}</title></rect>"
            )
            mid = x + bar / 2
            if low is not None and high is not None:
                cap = min(4.0, bar / 3)
                f.parts.append(
                    f'<path d="M{mid:.1f},{f.y(low):.1f}V{f.y(high):.1f}'
                    f"M{mid - cap:.1f},{f.y(low):.1f}h{2 * cap:.1f}"
                    f'M{mid - cap:.1f},{f.y(high):.1f}h{2 * cap:.1f}" stroke="#222" '
                    f'stroke-width="1.2" fill="none"/>'
                )
            count = s.counts[i] if s.counts is not None else None
            if count and text_width(count) * 0.8 <= bar + 2:
                top_y = f.y(max(v, high if high is not None else v))
                f.parts.append(f'<text x="{mid:.1f}" y="{top_y - 4:.1f}" text-anchor="middle" '
                               f'font-size="9" fill="#444">{escape(count)}</text>')  # fmt: skip
    return f.done()


@dataclass(frozen=True)
class ForestRow:
    """One interval of a forest chart; `value` None draws the label and a dash only."""

    label: str
    value: float | None
    low: float | None = None
    high: float | None = None
    note: str = ""  # words after the numbers, e.g. "12 tasks" or "zero width: one task"
    strong: bool = False  # the interval excludes 0: drawn dark, else grey


def forest_span(rows: Sequence[ForestRow]) -> float:
    """The largest distance from 0 of any value or interval end: what the x axis must hold."""
    return max((abs(v) for r in rows for v in (r.value, r.low, r.high) if v is not None),
               default=0.0)  # fmt: skip


def forest_chart(
    title: str,
    rows: Sequence[ForestRow],
    *,
    x_title: str,
    width: int = WIDTH,
    shared: Sequence[ForestRow] = (),
) -> str:
    """Differences as points with interval whiskers, one row each, around a line at 0: the
    x axis spans negative and positive values alike, in percentage points. `shared` holds the
    rows of every chart meant to be compared with this one: the axis's reach and the margins
    for labels fit them all, so each value sits at the same place in each chart."""
    if not any(r.value is not None for r in rows):
        return empty_chart(title, "no data (no task has both values)", width)
    every = [*rows, *shared]
    ticks = nice_ticks(max(forest_span(every), 0.01), 2)
    top = ticks[-1]
    left = 12 + round(max(text_width(r.label[:LEGEND_CHARS]) for r in every))
    texts = [_forest_text(r) for r in rows]
    right = 12 + round(max(text_width(_forest_text(r)) for r in every))
    pw = max(120, width - left - right - 12)
    row_h, y0 = 18, TITLE_H
    height = y0 + row_h * len(rows) + 46

    def x(v: float) -> float:
        return left + pw * (v + top) / (2 * top)

    p = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{escape(title)}" {FONT}>',
        f'<text x="{left}" y="18" font-size="13" font-weight="600">{escape(title)}</text>',
    ]
    bottom = y0 + row_h * len(rows) + 4
    for t in [-v for v in reversed(ticks[1:])] + ticks:
        p.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{y0 - 6}" y2="{bottom}" '
                 f'stroke="{"#333" if t == 0 else "#e4e4e4"}"/>')  # fmt: skip
        p.append(f'<text x="{x(t):.1f}" y="{bottom + 14}" text-anchor="middle">'
                 f"{100 * t:+.0f}</text>")  # fmt: skip
    for i, (r, text) in enumerate(zip(rows, texts, strict=True)):
        y = y0 + row_h * i + row_h / 2
        color = "#0072B2" if r.strong else "#888888"
        p.append(f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">'
                 f"{escape(r.label[:LEGEND_CHARS])}</text>")  # fmt: skip
        if r.value is not None:
            if r.low is not None and r.high is not None:
                p.append(f'<line x1="{x(r.low):.1f}" x2="{x(r.high):.1f}" y1="{y:.1f}" '
                         f'y2="{y:.1f}" stroke="{color}" stroke-width="2"/>')  # fmt: skip
            p.append(f'<circle cx="{x(r.value):.1f}" cy="{y:.1f}" r="3.5" fill="{color}">'
                     f"<title>{escape(r.label)}: {escape(text)}</title></circle>")  # fmt: skip
        p.append(f'<text x="{left + pw + 10}" y="{y + 4:.1f}" fill="{color}">'
                 f"{escape(text)}</text>")  # fmt: skip
    p.append(f'<text x="{left + pw / 2:.1f}" y="{height - 8}" text-anchor="middle">'
             f"{escape(x_title)}</text>")  # fmt: skip
    return "\n".join([*p, "</svg>"])


def _forest_text(r: ForestRow) -> str:
    if r.value is None:
        return "—" + (f"  {r.note}" if r.note else "")
    text = f"{100 * r.value:+.1f}"
    if r.low is not None and r.high is not None:
        text += f" [{100 * r.low:+.1f}, {100 * r.high:+.1f}]"
    return text + (f"  {r.note}" if r.note else "")
