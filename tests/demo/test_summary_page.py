"""The report's "What this demo shows" section (demo/summary_page.py) and the enforcement
lines it lays out (demo/summary.py)."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from budgetproxy.demo.agents import EpisodePlan, EpisodeResult
from budgetproxy.demo.frozenlake import TASKS
from budgetproxy.demo.summary import enforcement, refusal_breakdown
from budgetproxy.demo.summary_page import parse, summary_section

LINES = [
    "What this shows (numbers from this run; * marks an interval that excludes 0):",
    "- Budget-dependent ordering. Pass@1, hidden arm, careful − recovering (paired over 14 "
    "tasks): at 25% +0.18 [+0.04, +0.35], at 100% -0.14 [-0.24, -0.05].",
    "  Both intervals exclude 0 with opposite signs. The order flips.",
    "  At larger K: K=2: +0.10 [+0.01, +0.20] at 25%, -0.05 [-0.09, -0.01] at 100%, flips; "
    "K=8: +0.00 (zero width: no task differs) at 25%, +0.00 (zero width: no task differs) at "
    "100%, no supported flip.",
    "- Disclosure changes behaviour. Pass@1, budget-aware, disclosed − hidden (paired over 14 "
    "tasks): 25%: +0.34 [+0.18, +0.51] *; 50%: +0.03 [-0.06, +0.10].",
    "- Enforcement. The proxy refused 3 episodes of the tier runs a turn past their budget.",
    "  Over the whole run it refused 5 calls for a spent budget.",
    "BudgetMix groups (budget-aware, disclosed; the proxy drew one budget per group):",
    "  4x4: 8 turns (50%) 8/8, 5 turns (31%) 8/8",
    "  8x8<i>: 19 turns (59%) 5/8",
]


class Text(HTMLParser):
    def __init__(self, html: str) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.chunks: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.chunks.append(data)


def test_claims_become_cards_with_their_lines_lists_and_table() -> None:
    heading, claims = parse(LINES)
    assert heading.startswith("What this shows")
    assert [c.title for c in claims] == ["Budget-dependent ordering",
                                         "Disclosure changes behaviour", "Enforcement",
                                         "BudgetMix groups"]  # fmt: skip
    assert claims[0].lines[0] == "Both intervals exclude 0 with opposite signs. The order flips."
    assert claims[3].rows == [("4x4", "8 turns (50%) 8/8, 5 turns (31%) 8/8"),
                              ("8x8<i>", "19 turns (59%) 5/8")]  # fmt: skip
    html = summary_section(LINES)
    assert html.count("<div class=claim>") == 4
    assert "<pre>" not in html
    # per-tier values and the larger-K verdicts are lists, one item each
    assert re.findall(r"<li>(.*?)</li>", html)[2:4] == [
        "25%: <span class='ci sig'>+0.34 [+0.18, +0.51] *</span>",
        "50%: <span class='ci'>+0.03 [-0.06, +0.10]</span>"]
    assert html.count("<li>") == 4
    assert "<span class='ci'>+0.00 (zero width: no task differs)</span>" in html
    # every word of the summary is on the page, and nothing in it became markup
    text = " ".join(" ".join(Text(html).chunks).split())
    assert "8x8<i>" in text and "<i>" not in html.replace("8x8&lt;i&gt;", "")
    for line in LINES[1:]:
        for word in re.findall(r"[a-z]{5,}", line):
            assert word in text, word


def _result(run: str, exhausted: bool, policy: str = "careful") -> EpisodeResult:
    plan = EpisodePlan(TASKS[0], policy, 4, "hidden", 1, run=run)  # type: ignore[arg-type]
    return EpisodeResult(plan, "e", 4, won=not exhausted, turns=4, moves=8, fell=False,
                         exhausted=exhausted)


def test_enforcement_says_why_the_tier_count_and_the_run_total_differ() -> None:
    results = [_result("tiers", True), _result("tiers", False), _result("tiers", True),
               _result("budgetmix", True), _result("tokens", True), _result("tokens", True),
               _result("tokens", False)]  # fmt: skip
    first, second = enforcement(results)
    assert first.startswith("The proxy refused 2 episodes of the tier runs a turn past their "
                            "budget") and "careful hidden 2/3" in first  # fmt: skip
    assert refusal_breakdown(results) == ("5 calls (2 in the tier runs, 1 in the BudgetMix "
                                          "groups, 2 in the token arm)")
    assert refusal_breakdown(results[1:2]) == "0 calls"
    assert "refused 5 calls (2 in the tier runs" in second
    assert "one call per episode that ran out" in second
    assert "leaves out the BudgetMix groups and the token arm" in second
