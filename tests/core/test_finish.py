"""The finish-mode text: the template of the axis that ran out, with its numbers."""

from __future__ import annotations

from budgetproxy.config import FinishTexts
from budgetproxy.core.episode import EpisodeState
from budgetproxy.core.finish import finish_text

TEXTS = {"turns": "turns {used}/{total}", "tokens": "tokens {used}/{total}",
         "cost": "cost {used}/{total}", "time": "time {used}/{total}"}


def episode(**kw: object) -> EpisodeState:
    return EpisodeState(episode_id="e", budget=4, max_turns=None, disclosure="hidden", **kw)  # type: ignore[arg-type]


def test_each_axis_names_itself_with_its_numbers() -> None:
    assert finish_text(TEXTS, episode(turns_used=4), 0.0) == "turns 4/4"
    assert finish_text(TEXTS, episode(token_budget=50, tokens_used=61, exhausted_by="tokens"),
                       0.0) == "tokens 61/50"
    assert finish_text(TEXTS, episode(cost_budget=0.5, cost_used=0.5000001,
                                      exhausted_by="cost"), 0.0) == "cost 0.5/0.5"
    assert finish_text(TEXTS, episode(time_budget_s=60.0, first_call_at=100.0,
                                      exhausted_by="time"), 175.5) == "time 75/60"


def test_a_refused_turn_only_episode_and_an_unknown_axis_read_as_turns() -> None:
    assert finish_text(TEXTS, episode(turns_used=1, refused=True), 0.0) == "turns 1/4"
    assert finish_text(TEXTS, episode(exhausted_by="other"), 0.0) == "turns 0/4"


def test_a_spec_the_values_do_not_take_gives_the_template_never_an_error() -> None:
    texts = {**TEXTS, "cost": "spent {used:d}"}
    assert finish_text(texts, episode(cost_budget=1.0, cost_used=1.5, exhausted_by="cost"),
                       0.0) == "spent {used:d}"


def test_the_defaults_name_their_axis() -> None:
    defaults = FinishTexts().model_dump()
    for axis, word in (("tokens", "Token"), ("cost", "Cost"), ("time", "Time")):
        st = episode(exhausted_by=axis)
        assert finish_text(defaults, st, 0.0).startswith(f"[{word} budget exhausted]")
    assert finish_text(defaults, episode(turns_used=4), 0.0) == (
        "[Turn budget exhausted] This episode has no turns left.")
