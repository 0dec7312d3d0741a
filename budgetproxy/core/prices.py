"""Model prices in USD: config overrides by model glob, over the genai-prices library's table."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

from budgetproxy.core.usage import billed_tokens, token_counts


class PriceTable:
    """USD per token for a model: the first matching `prices` glob of the config, else
    genai-prices (imported on the first lookup it serves, so a proxy that prices nothing never
    loads it). Lookups are cached per model name; a model neither knows has no price (None).

    The library's price of a call follows its whole usage (cache reads are cheaper, some
    models' rates step up past a prompt length); its rate per output token, used to size a
    call's reservation, is taken at a small usage.
    """

    def __init__(self, overrides: Mapping[str, Mapping[str, float]] | None = None) -> None:
        self.overrides = [(glob, float(p.get("input_per_mtok", 0.0)),
                           float(p.get("output_per_mtok", 0.0)))
                          for glob, p in (overrides or {}).items()]
        self._rates: dict[str, tuple[float, float] | None] = {}
        # each model's matching override (a glob match per call would cost more than the
        # rest of the pricing); forgotten whole past _MODELS_KEPT names
        self._matched: dict[str, tuple[float, float] | None] = {}

    def _override(self, model: str) -> tuple[float, float] | None:
        matched = self._matched
        if model in matched:
            return matched[model]
        found = None
        for glob, inp, out in self.overrides:
            if fnmatch.fnmatchcase(model, glob):
                found = inp / 1e6, out / 1e6
                break
        if len(matched) >= _MODELS_KEPT:
            matched.clear()
        matched[model] = found
        return found

    def cached_output_rate(self, model: str) -> float | None:
        """The output rate if already known (no lookup): the hot path's cheap question."""
        rates = self._rates.get(model)
        return None if rates is None else rates[1]

    def rates(self, model: str) -> tuple[float, float] | None:
        """(input, output) USD per token; None when no price is known for `model`."""
        if model in self._rates:
            return self._rates[model]
        found = self._override(model)
        if found is None:
            found = _library_rates(model)
        if len(self._rates) >= _MODELS_KEPT:  # (names are the clients' to choose)
            self._rates.clear()
        self._rates[model] = found
        return found

    def cost(self, model: str, usage: Any,
             tokens: tuple[int | None, int | None] | None = None) -> float | None:
        """The USD price of one call's reported usage; None without a price or usage.
        `tokens`: the usage's `token_counts`, when the caller has them already."""
        matched = self._matched  # (the usual case, a model seen before: no call)
        override = matched[model] if model in matched else self._override(model)
        if override is not None:  # input (cached included) and output at the config's rates
            tin, tout = token_counts(usage) if tokens is None else tokens
            if tin is None and tout is None:
                return None
            return (tin or 0) * override[0] + (tout or 0) * override[1]
        counts = billed_tokens(usage)
        if counts is None:
            return None
        exact = _library_cost(model, counts)
        if exact is not None:
            return exact
        rates = self.rates(model)
        if rates is None:
            return None
        return counts[0] * rates[0] + counts[1] * rates[1]


_MODELS_KEPT = 1024
_PROBE = 1000  # tokens: the usage at which a library rate per token is read


def _library_rates(model: str) -> tuple[float, float] | None:
    try:
        from genai_prices import Usage, calc_price
    except ImportError:  # pragma: no cover - it is a dependency; a broken install prices nothing
        return None
    try:
        inp = calc_price(Usage(input_tokens=_PROBE), model).total_price
        out = calc_price(Usage(output_tokens=_PROBE), model).total_price
    except LookupError:
        return None
    return float(inp) / _PROBE, float(out) / _PROBE


def _library_cost(model: str, counts: tuple[int, int, int, int]) -> float | None:
    try:
        from genai_prices import Usage, calc_price
    except ImportError:  # pragma: no cover
        return None
    tin, tout, read, write = counts
    kwargs = {"input_tokens": tin, "output_tokens": tout, "cache_read_tokens": read,
              "cache_write_tokens": write}
    try:
        return float(calc_price(Usage(**{k: v for k, v in kwargs.items() if v}), model)
                     .total_price)
    except (LookupError, ValueError):
        return None
