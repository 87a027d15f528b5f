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

from pydantic import Field, Strict, model_validator

from pipeline.decision.catalog import HardwareTarget
from pipeline.errors import ConfigError
from pipeline.settings import Fraction, NonNegative, PositiveInt, Section

Positive = Annotated[float, Field(gt=0)]
# The axes a map can be drawn over: traffic and GPU price as factors of today's, model
# changes a quarter and shared-prefix share as values.
MapAxisName = Literal["traffic", "model_changes", "gpu_price", "prefix_share"]
MAP_AXES: tuple[str, ...] = get_args(MapAxisName)
# A scenario's current_engine for "no engine runs today" (null keeps today's).
NEW_DEPLOYMENT = "none"


class ScenarioChanges(Section):
    """One named scenario: what changes against today (null: unchanged). The defaults are
    here, not in defaults.yaml, because the scenarios' names are the team's own."""

    # Arrivals closer in time by this factor: the mean and peak rates (and the volume) scale
    # together.
    traffic_scale: Positive | None = None
    prompt_length_scale: Positive | None = None
    output_length_scale: Positive | None = None
    # The shared-prefix share the prefix rules read (0 .. 1).
    prefix_share: Fraction | None = None
    model_changes_per_quarter: NonNegative | None = None
    # Every GPU's $/hour × this factor.
    gpu_price_factor: Positive | None = None
    # $/GPU-hour by GPU type (matched as bench.prices are), applied after the factor.
    gpu_hour_usd: dict[str, Positive] = Field(default_factory=dict)
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
    start: NonNegative
    stop: NonNegative
    points: PositiveInt
    log: bool

    @model_validator(mode="after")
    def _range(self) -> Self:
        if self.stop <= self.start:
            raise ValueError(f"stop ({self.stop:g}) must be above start ({self.start:g})")
        if self.log and self.start <= 0:
            raise ValueError("a log-spaced axis needs start > 0")
        if self.axis == "prefix_share" and self.stop > 1:
            raise ValueError("prefix_share runs from 0 to 1")
        if self.points < 2:
            raise ValueError("an axis needs at least 2 points")
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
    scenarios: dict[str, ScenarioChanges]
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
