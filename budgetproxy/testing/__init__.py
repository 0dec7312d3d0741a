"""Test support: a fake OpenAI-compatible upstream for tests, demos and benchmarks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from budgetproxy.testing.fake_upstream import FakeUpstream, Received

__all__ = ["FakeUpstream", "Received"]


def __getattr__(name: str) -> Any:
    # Imported lazily so `python -m budgetproxy.testing.fake_upstream` runs the module only once.
    if name in __all__:
        from budgetproxy.testing import fake_upstream

        return getattr(fake_upstream, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
