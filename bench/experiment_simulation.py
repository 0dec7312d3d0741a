"""The live-experiment confidence sequence under peeking: type I error, coverage and power.

Simulates experiments whose two arms succeed with known rates, reads the interval after every
pair, and prints the share that ever stopped for a winner (equal arms: the type I error), the
share whose interval ever missed the true difference, and how soon a real difference was found.

    python bench/experiment_simulation.py [--runs 1000] [--pairs 500] [--seed 2026]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--pairs", type=int, default=500)
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args()
    rng = random.Random(args.seed)
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
