"""The experiment API: an experiment's arms, its always-valid difference and its decision."""

from __future__ import annotations

from typing import Any, Literal

import orjson
from fastapi import FastAPI
from fastapi.responses import Response
from pydantic import BaseModel

from budgetproxy.errors import ProxyError
from budgetproxy.proxy.experiments import Experiments


class ArmView(BaseModel):
    name: str
    episodes: int
    successes: int
    estimate: float | None  # the metric's mean over the arm's episodes, in its units
    left_out: int
    clipped: int  # outcomes outside [metric_min, metric_max], counted at the nearer end


class DifferenceView(BaseModel):
    estimate: float | None
    cs_low: float
    cs_high: float
    pairs: int


class ComparisonView(BaseModel):
    a: str
    b: str
    difference: DifferenceView
    decision: str


class ExperimentView(BaseModel):
    """GET /v1/experiments/{name} (docs/experiments.md)."""
    name: str
    unit: str
    metric: Literal["success", "pass_at_tier", "reward", "tokens", "cost"]
    metric_min: float
    metric_max: float
    tier: float | None
    better: Literal["higher", "lower"]  # what stop_a_better / stop_b_better call better
    alpha: float
    min_effect: float | None
    arms: list[ArmView]
    difference: DifferenceView
    decision: Literal["continue", "stop_a_better", "stop_b_better", "stop_futile"]
    comparisons: list[ComparisonView]
    stopped: str | None
    caution: str | None  # why the decision is unsafe to act on while episodes run


def add_experiment_routes(app: FastAPI, experiments: Experiments) -> None:
    @app.get("/v1/experiments/{name}", responses={
        200: {"model": ExperimentView, "description": "The experiment's state now"}})
    async def get_experiment(name: str) -> Response:
        exp = experiments.by_name.get(name)
        if exp is None:
            raise ProxyError(404, "experiment_not_found", f"No experiment named {name!r}",
                             param="name")
        view: dict[str, Any] = await experiments.view(exp)
        return Response(orjson.dumps(view), media_type="application/json")
