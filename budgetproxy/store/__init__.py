"""Episode stores: where episode state lives (memory for one process, Redis for replicas)."""

from budgetproxy.store.base import (
    EpisodeStore,
    FinishOutcome,
    StoreUnavailable,
    TurnClose,
    TurnOpen,
)

__all__ = ["EpisodeStore", "FinishOutcome", "StoreUnavailable", "TurnClose", "TurnOpen"]
