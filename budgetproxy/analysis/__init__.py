"""Offline analysis of trajectory logs: Pass@(K,T), HTML report, recovery view, BudgetMix audit.

Nothing heavy is imported here; `command.register` wires `budgetproxy analyze` into the CLI and
DuckDB/numpy load only when the command runs. `passk` is the pure estimator for other callers.
"""

from budgetproxy.analysis.passk import pass_at_k, round_half_up, tier_to_turns

__all__ = ["pass_at_k", "round_half_up", "tier_to_turns"]
