"""The live-experiment confidence sequence under peeking: type I error, coverage and power.

Simulates experiments whose two arms succeed with known rates, reads the interval after every
pair, and prints the share that ever stopped for a winner (equal arms: the type I error), the
share whose interval ever missed the true difference, and how soon a real difference was found.
`--metric continuous` does the same for a bounded continuous metric (tokens spent in
[0, 4000]: a Beta-shaped spend, nothing a fifth of the time), rescaled to [0, 1] as the proxy
does and reported back in tokens.

    python bench/experiment_simulation.py [--runs 1000] [--pairs 500] [--seed 2026]
        [--metric success|continuous]
"""

from __future__ import annotations

import argparse
import random

from budgetproxy.core.sequential import DifferenceSequence, decide

ALPHA = 0.05


def one(p_a: float, p_b: float, pairs: int, rng: random.Random) -> tuple[bool, int | None]:
    """(ever missed the true difference, pairs when it first stopped for a winner or None)."""
    seq = DifferenceSequence(ALPHA)
    truth, missed, stopped = p_a - p_b, False, None
    for i in range(pairs):
        seq.add(float(rng.random() < p_a), float(rng.random() < p_b))
        iv = seq.interval()
        missed = missed or not iv.low <= truth <= iv.high
        if stopped is None and decide(iv.low, iv.high, None) != "continue":
            stopped = i + 1
    return missed, stopped


TOKENS_MAX = 4000.0


def spend(rng: random.Random, mean: float) -> float:
    """Tokens in [0, TOKENS_MAX] with the given mean (at most 0.8 of the range): nothing a
    fifth of the time, else a Beta(4m, 4(1 - m)) share of the range, m = mean / 0.8."""
    m = mean / TOKENS_MAX / 0.8
    return TOKENS_MAX * rng.betavariate(4 * m, 4 * (1 - m)) if rng.random() < 0.8 else 0.0


def one_continuous(m_a: float, m_b: float, pairs: int,
                   rng: random.Random) -> tuple[bool, int | None]:
    """As `one`, on spend rescaled to [0, 1] and the interval read back in tokens."""
    seq = DifferenceSequence(ALPHA)
    truth, missed, stopped = m_a - m_b, False, None
    for i in range(pairs):
        seq.add(spend(rng, m_a) / TOKENS_MAX, spend(rng, m_b) / TOKENS_MAX)
        iv = seq.interval()
        low, high = iv.low * TOKENS_MAX, iv.high * TOKENS_MAX
        missed = missed or not low <= truth <= high
        if stopped is None and decide(low, high, None) != "continue":
            stopped = i + 1
    return missed, stopped


def continuous(args: argparse.Namespace, rng: random.Random) -> None:
    print(f"tokens in [0, {TOKENS_MAX:g}], alpha {ALPHA}, {args.runs} experiments of "
          f"{args.pairs} pairs, read after every pair")
    for m in (400.0, 1600.0, 2800.0):
        runs = [one_continuous(m, m, args.pairs, rng) for _ in range(args.runs)]
        wrong = sum(s is not None for _, s in runs) / args.runs
        print(f"equal arms at mean {m:g}: type I error {wrong:.3f}")
    for m_a, m_b in ((2400.0, 1200.0), (1800.0, 1600.0), (800.0, 2800.0)):
        runs = [one_continuous(m_a, m_b, args.pairs, rng) for _ in range(args.runs)]
        missed = sum(m for m, _ in runs) / args.runs
        stops = sorted(s for _, s in runs if s is not None)
        median = stops[len(stops) // 2] if stops else None
        print(f"{m_a:g} vs {m_b:g}: interval ever missed {missed:.3f}; found within "
              f"{args.pairs} pairs in {len(stops) / args.runs:.3f}, median {median} pairs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--pairs", type=int, default=500)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--metric", choices=("success", "continuous"), default="success")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    if args.metric == "continuous":
        continuous(args, rng)
        return
    print(f"alpha {ALPHA}, {args.runs} experiments of {args.pairs} pairs, read after every pair")
    for p in (0.1, 0.5, 0.8):
        runs = [one(p, p, args.pairs, rng) for _ in range(args.runs)]
        wrong = sum(s is not None for _, s in runs) / args.runs
        print(f"equal arms at {p}: type I error {wrong:.3f}")
    for p_a, p_b in ((0.7, 0.4), (0.6, 0.5), (0.9, 0.2)):
        runs = [one(p_a, p_b, args.pairs, rng) for _ in range(args.runs)]
        missed = sum(m for m, _ in runs) / args.runs
        stops = sorted(s for _, s in runs if s is not None)
        median = stops[len(stops) // 2] if stops else None
        print(f"{p_a} vs {p_b}: interval ever missed {missed:.3f}; found within "
              f"{args.pairs} pairs in {len(stops) / args.runs:.3f}, median {median} pairs")


if __name__ == "__main__":
    main()
