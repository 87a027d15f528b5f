"""The what-if stage's typed result: one entry per named scenario and the decision map (one
cell per grid point), as ``whatif/whatif.json`` holds it."""

from __future__ import annotations

from typing import Any

from pipeline.settings import versioned
from pipeline.unknown import ResultModel

SCHEMA_VERSION = 1


class ScenarioOutcome(ResultModel):
    """The decision re-run on one scenario's changed inputs, beside today's."""

    name: str
    changes: dict[str, Any]  # the scenario's changes as configured (unchanged keys left out)
    engine: str | None
    engine_name: str | None
    runner_up: str | None
    runner_up_name: str | None
    routing_layer: str | None
    confidence: str
    monthly_cost_usd: float | None  # the recommended engine's GPU fleet, whole replicas
    # ... at its capacity band's ends (None: no band, the benchmark's own figures or unknown)
    monthly_cost_band_usd: tuple[float, float] | None = None
    monthly_total_usd: float | None  # ... plus the recurring cost of model changes
    headline: str
    # What differs from today's decision, one sentence each (empty: the same decision).
    against_today: list[str]
    # How each change was applied and what it approximates (docs/whatif.md).
    approximations: list[str]


class MapAxisValues(ResultModel):
    axis: str  # traffic, model_changes, gpu_price or prefix_share
    unit: str
    log: bool
    values: list[float]
    today: float | None  # where today sits on the axis (None: unknown)


class MapMark(ResultModel):
    """A flip condition or revisit trigger of today's record, placed on one axis."""

    kind: str  # "flip" or "trigger"
    id: str
    axis: str  # "x" or "y"
    value: float
    engine: str | None  # the answer past a flip (None for a trigger)
    text: str


class DecisionMap(ResultModel):
    """The winning engine over the grid: ``cells[j][i]`` is at ``x.values[i]``,
    ``y.values[j]`` (None: no engine recommended); ``ties`` the same shape."""

    x: MapAxisValues
    y: MapAxisValues
    engines: dict[str, str]  # engine key → display name, of every engine on the map
    cells: list[list[str | None]]
    ties: list[list[bool]]
    today_engine: str | None
    marks: list[MapMark]
    decisions: int


class WhatifResult(ResultModel):
    schema_version: int
    workload: str
    today_engine: str | None
    today_confidence: str
    today_monthly_cost_usd: float | None
    today_monthly_cost_band_usd: tuple[float, float] | None = None
    scenarios: list[ScenarioOutcome]
    map: DecisionMap | None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = self.model_dump(mode="json")
        return out

    @classmethod
    def from_json(cls, data: Any, where: str = "whatif.json") -> WhatifResult:
        return versioned(cls, data, where, SCHEMA_VERSION, "what-if", "re-run `enginefit whatif`")
