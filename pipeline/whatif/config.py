"""The ``whatif`` section of ``enginefit.yaml``: named scenarios and the decision map's axes
(defaults and their documentation: ``pipeline/defaults.yaml``; how each change is applied:
docs/whatif.md).

``scenarios``
    Name → the changes to today's inputs; a change left out (null) keeps today's value.
``map``
    The two axes of the decision map, each an axis name with its range and number of points.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self, get_args

from pydantic import (
    AfterValidator,
    Field,
    Strict,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pipeline.costing import MAX_GPU_HOUR_USD
from pipeline.decision.catalog import HardwareTarget
from pipeline.decision.config import MAX_MODEL_CHANGES_PER_QUARTER, ModelChanges
from pipeline.errors import ConfigError
from pipeline.settings import Fraction, Section, between

# A scenario scales today's traffic, lengths or prices by 1/1000 to 1000: past that the
# question is another workload, and the products overflow what the decision computes.
MIN_SCALE = 0.001
MAX_SCALE = 1_000.0
Scale = Annotated[float, between(MIN_SCALE, MAX_SCALE)]
# Every scenario is one more decision (about 0.2 s each on a laptop): a hundred is a long memo.
MAX_SCENARIOS = 100
# A scenario's name is a label in the memo and the map: printable, one line.
MAX_SCENARIO_NAME = 80


def _scenario_name(value: str) -> str:
    name = value.strip()
    if not 0 < len(name) <= MAX_SCENARIO_NAME or not name.isprintable():
        raise ValueError(
            f"a scenario's name is one printable line of 1 to {MAX_SCENARIO_NAME} characters"
        )
    return name


ScenarioName = Annotated[str, AfterValidator(_scenario_name)]
GpuTypeName = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
GpuHourUsd = Annotated[float, between(0, MAX_GPU_HOUR_USD, low_open=True)]
# The axes a map can be drawn over: traffic and GPU price as factors of today's, model
# changes a quarter and shared-prefix share as values.
MapAxisName = Literal["traffic", "model_changes", "gpu_price", "prefix_share"]
MAP_AXES: tuple[str, ...] = get_args(MapAxisName)
# Each axis's sane range: the factors as a scenario's, model changes as requirements', shares
# 0 .. 1.
AXIS_RANGE: dict[str, tuple[float, float]] = {
    "traffic": (MIN_SCALE, MAX_SCALE),
    "gpu_price": (MIN_SCALE, MAX_SCALE),
    "model_changes": (0.0, MAX_MODEL_CHANGES_PER_QUARTER),
    "prefix_share": (0.0, 1.0),
}
# Points an axis has at most: every cell of the map is one decision (about 0.4 ms), so the
# largest map, 100 x 100 = 10,000 cells, takes seconds.
MAX_MAP_POINTS = 100
# A scenario's current_engine for "no engine runs today" (null keeps today's).
NEW_DEPLOYMENT = "none"


class ScenarioChanges(Section):
    """One named scenario: what changes against today (null: unchanged). The defaults are
    here, not in defaults.yaml, because the scenarios' names are the team's own."""

    # Arrivals closer in time by this factor: the mean and peak rates (and the volume) scale
    # together.
    traffic_scale: Scale | None = None
    prompt_length_scale: Scale | None = None
    output_length_scale: Scale | None = None
    # The shared-prefix share the prefix rules read (0 .. 1).
    prefix_share: Fraction | None = None
    model_changes_per_quarter: ModelChanges | None = None
    # Every GPU's $/hour × this factor.
    gpu_price_factor: Scale | None = None
    # $/GPU-hour by GPU type (matched as bench.prices are), applied after the factor.
    gpu_hour_usd: dict[GpuTypeName, GpuHourUsd] = Field(default_factory=dict)
    hardware: Annotated[tuple[HardwareTarget, ...], Strict(False)] | None = None
    # The engine running today (a catalog name); "none": a new deployment.
    current_engine: str | None = None
    # The SLO as --slo gives it: the latency limits named replace the configured ones, options
    # not named keep bench.slo's, e.g. {ttft_p95_ms: 500, itl_p99_ms: 60}; checked on loading.
    slo: dict[str, Any] | None = None


class MapAxis(Section):
    """One axis of the decision map: ``points`` values from ``start`` to ``stop`` (both
    included), log-spaced when ``log``."""

    axis: MapAxisName
    start: Annotated[float, Field(ge=0)]
    stop: Annotated[float, Field(ge=0)]
    points: Annotated[int, between(2, MAX_MAP_POINTS)]
    log: bool

    @field_validator("start", "stop")
    @classmethod
    def _within_axis(cls, value: float, info: ValidationInfo) -> float:
        axis = info.data.get("axis")
        if axis in AXIS_RANGE:
            low, high = AXIS_RANGE[axis]
            if not low <= value <= high:
                raise ValueError(f"the {axis} axis runs from {low:g} to {high:g}")
        return value

    @model_validator(mode="after")
    def _range(self) -> Self:
        if self.stop <= self.start:
            raise ValueError(f"stop ({self.stop:g}) must be above start ({self.start:g})")
        if self.log and self.start <= 0:
            raise ValueError("a log-spaced axis needs start > 0")
        return self

    def values(self) -> list[float]:
        n = self.points - 1
        if self.log:
            ratio = self.stop / self.start
            return [self.start * ratio ** (k / n) for k in range(self.points)]
        return [self.start + (self.stop - self.start) * k / n for k in range(self.points)]


class MapConfig(Section):
    x: MapAxis
    y: MapAxis
    # Further axes ``--map X,Y`` may name (their ranges); x and y are the default pair.
    axes: dict[MapAxisName, MapAxis]

    @model_validator(mode="after")
    def _distinct(self) -> Self:
        if self.x.axis == self.y.axis:
            raise ValueError(f"x and y are both {self.x.axis!r}: name two different axes")
        for name, axis in self.axes.items():
            if axis.axis != name:
                raise ValueError(f"axes.{name} describes axis {axis.axis!r}")
        return self

    def axis(self, name: str) -> MapAxis | None:
        """The configured range of axis ``name`` (x, y, then the other axes)."""
        found = [a for a in (self.x, self.y, *self.axes.values()) if a.axis == name]
        return found[0] if found else None


class WhatifConfig(Section):
    scenarios: Annotated[dict[ScenarioName, ScenarioChanges], Field(max_length=MAX_SCENARIOS)]
    map: MapConfig


def map_pair(config: MapConfig, text: str, where: str = "--map") -> tuple[MapAxis, MapAxis]:
    """The two axes ``X,Y`` names (each ranged as ``whatif.map`` configures it)."""
    names = [part.strip() for part in text.split(",")]
    known = ", ".join(a for a in MAP_AXES)
    if len(names) != 2:
        raise ConfigError(f"{where}: give two axes as X,Y (of {known}), got {text!r}")
    found = []
    for name in names:
        axis = config.axis(name)
        if axis is None and name in MAP_AXES:
            raise ConfigError(f"{where}: axis {name!r} has no range: set whatif.map.axes.{name}")
        if axis is None:
            raise ConfigError(f"{where}: no axis {name!r}; the axes are {known}")
        found.append(axis)
    if names[0] == names[1]:
        raise ConfigError(f"{where}: x and y are both {names[0]!r}: name two different axes")
    return found[0], found[1]
