"""budgetproxy: an OpenAI-compatible proxy that enforces and discloses per-episode turn budgets."""

__version__ = "0.1.0"

__all__ = ["__version__"]
