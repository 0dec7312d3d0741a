"""The confidence sequence under peeking: type I error and coverage by simulation (seeded)."""

from __future__ import annotations

import random

import pytest

from budgetproxy.core.sequential import (
    DifferenceSequence,
    MeanSequence,
    Pairer,
    decide,
    paired,
)

ALPHA = 0.05


def _ever_excludes(p_a: float, p_b: float, pairs: int, rng: random.Random) -> bool:
    """Whether the interval, read after every pair, ever excluded the true difference."""
    seq = DifferenceSequence(ALPHA)
    truth = p_a - p_b
    for _ in range(pairs):
        seq.add(float(rng.random() < p_a), float(rng.random() < p_b))
        iv = seq.interval()
        if not iv.low <= truth <= iv.high:
            return True
    return False


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_type_one_error_at_most_alpha_when_read_after_every_pair(p: float) -> None:
    """Equal arms: the share of runs that ever stopped for a winner is at most alpha."""
    rng = random.Random(41)
    runs, wrong = 300, 0
    for _ in range(runs):
        seq = DifferenceSequence(ALPHA)
        for _ in range(300):
            seq.add(float(rng.random() < p), float(rng.random() < p))
            iv = seq.interval()
            if decide(iv.low, iv.high, None) != "continue":
                wrong += 1
                break
    assert wrong / runs <= ALPHA


@pytest.mark.parametrize(("p_a", "p_b"), [(0.7, 0.4), (0.3, 0.35), (0.9, 0.2)])
def test_coverage_holds_under_peeking(p_a: float, p_b: float) -> None:
    rng = random.Random(7)
    runs = 300
    missed = sum(_ever_excludes(p_a, p_b, 300, rng) for _ in range(runs))
    assert missed / runs <= ALPHA


def test_a_real_difference_is_found() -> None:
    rng = random.Random(3)
    seq = DifferenceSequence(ALPHA)
    for _ in range(400):
        seq.add(float(rng.random() < 0.8), float(rng.random() < 0.4))
    iv = seq.interval()
    assert decide(iv.low, iv.high, None) == "stop_a_better"
    assert iv.estimate is not None and iv.low < iv.estimate < iv.high


def test_futility_at_the_minimum_effect() -> None:
    rng = random.Random(5)
    seq = DifferenceSequence(ALPHA)
    for _ in range(3000):
        y = float(rng.random() < 0.5)
        seq.add(y, y if rng.random() < 0.9 else 1 - y)
    iv = seq.interval()
    assert decide(iv.low, iv.high, 0.1) == "stop_futile"
    assert decide(iv.low, iv.high, None) == "continue"


def test_the_interval_only_narrows() -> None:
    rng = random.Random(9)
    seq = MeanSequence(ALPHA)
    low, high = 0.0, 1.0
    for _ in range(200):
        seq.add(float(rng.random() < 0.3))
        assert seq.low >= low and seq.high <= high
        low, high = seq.low, seq.high


def test_pairs_within_a_task_in_finishing_order() -> None:
    outcomes = [("t1", 0, 1.0), ("t2", 1, 0.0), ("t1", 0, 0.0), ("t1", 1, 1.0),
                ("t2", 0, 1.0), (None, 1, 1.0), ("t1", 2, 0.0)]
    assert list(paired(outcomes, 0, 1, by_task=True)) == [(1.0, 1.0), (1.0, 0.0)]
    assert list(paired(outcomes, 0, 1, by_task=False)) == [(1.0, 0.0), (0.0, 1.0),
                                                            (1.0, 1.0)]


def _experiment(effect: float, rng: random.Random, episodes: int = 400) -> tuple[bool, bool]:
    """Episodes on 20 tasks of different difficulty (0.1 to 0.6), each arm drawn per episode,
    arm 0 better by `effect` on every task, pairs within the task, the interval read after
    every episode: (ever stopped for a winner, ever missed the true difference)."""
    difficulty = [rng.uniform(0.1, 0.6) for _ in range(20)]
    pairer = Pairer(0, 1, by_task=True)
    seq = DifferenceSequence(ALPHA)
    stopped = missed = False
    for _ in range(episodes):
        task, arm = rng.randrange(20), rng.randrange(2)
        p = difficulty[task] + (effect if arm == 0 else 0.0)
        pair = pairer.add(f"t{task}", arm, float(rng.random() < p))
        if pair is None:
            continue
        seq.add(*pair)
        iv = seq.interval()
        stopped = stopped or decide(iv.low, iv.high, None) != "continue"
        missed = missed or not iv.low <= effect <= iv.high
    return stopped, missed


@pytest.mark.parametrize("effect", [0.0, 0.3])
def test_episodes_paired_within_tasks_read_after_each(effect: float) -> None:
    """Tasks differ; arms are drawn per episode: with equal arms the share of experiments that
    ever stopped is at most alpha, and the interval holds the effect in all but alpha."""
    rng = random.Random(11)
    runs = [_experiment(effect, rng) for _ in range(200)]
    assert sum(m for _, m in runs) / len(runs) <= ALPHA
    if effect == 0.0:
        assert sum(s for s, _ in runs) / len(runs) <= ALPHA
    else:  # a real effect of 0.3 is found within 400 episodes
        assert sum(s for s, _ in runs) / len(runs) > 0.5


def _continuous(rng: random.Random, mean: float) -> float:
    """A bounded continuous outcome in [0, 1] with the given mean: a Beta with its
    concentration at 4, with a point mass at 0 (a reward of nothing) a fifth of the time."""
    inner = mean / 0.8  # (means up to 0.8)
    return rng.betavariate(4 * inner, 4 * (1 - inner)) if rng.random() < 0.8 else 0.0


@pytest.mark.parametrize("mean", [0.1, 0.4, 0.7])
def test_continuous_outcomes_type_one_error_at_most_alpha(mean: float) -> None:
    """A bounded continuous metric (a reward, tokens over their range), equal arms, read
    after every pair: the share of runs that ever stopped for a winner is at most alpha."""
    rng = random.Random(43)
    runs, wrong = 300, 0
    for _ in range(runs):
        seq = DifferenceSequence(ALPHA)
        for _ in range(300):
            seq.add(_continuous(rng, mean), _continuous(rng, mean))
            iv = seq.interval()
            if decide(iv.low, iv.high, None) != "continue":
                wrong += 1
                break
    assert wrong / runs <= ALPHA


@pytest.mark.parametrize(("m_a", "m_b"), [(0.6, 0.3), (0.45, 0.4), (0.2, 0.7)])
def test_continuous_outcomes_coverage_under_peeking(m_a: float, m_b: float) -> None:
    rng = random.Random(13)
    runs = missed = found = 0
    for _ in range(300):
        runs += 1
        seq = DifferenceSequence(ALPHA)
        ever_missed = False
        for _ in range(300):
            seq.add(_continuous(rng, m_a), _continuous(rng, m_b))
            iv = seq.interval()
            ever_missed = ever_missed or not iv.low <= m_a - m_b <= iv.high
        missed += ever_missed
        found += decide(iv.low, iv.high, None) != "continue"
    assert missed / runs <= ALPHA
    if abs(m_a - m_b) >= 0.3:  # a difference of 0.3 of the range is found within 300 pairs
        assert found / runs > 0.9
