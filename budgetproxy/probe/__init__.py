"""State diagnostics: two policies' next actions compared from the same logged states."""

from budgetproxy.probe.run import ProbeOptions, run_probe
from budgetproxy.probe.scorers import Scorer, load_scorer
from budgetproxy.probe.states import State

__all__ = ["ProbeOptions", "Scorer", "State", "load_scorer", "run_probe"]
