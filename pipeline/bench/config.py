"""The ``bench`` section of ``enginefit.yaml`` (defaults and their documentation:
``pipeline/defaults.yaml``).

The SLO and the price table keep their own domain types (:class:`~pipeline.bench.slo.SloSpec`,
:class:`~pipeline.bench.cost.Prices`), parsed by their modules; their errors name the key.
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict, Field

from pipeline.bench.cost import Prices, prices_from_mapping
from pipeline.bench.slo import SloSpec, slo_from_mapping
from pipeline.errors import ConfigError
from pipeline.settings import (
    ConfigDate,
    ConfigPath,
    NonNegativeInt,
    PositiveInt,
    Section,
    tuple_of,
)


class OverloadRule(Section):
    """When an open-loop point counts as having fallen behind (:mod:`pipeline.bench.keepup`).

    ``tolerance``: overloaded when completions kept pace with less than 1 − tolerance of sends.
    ``min_window_latencies``: the sending window must span this many early-request latencies.
    """

    tolerance: Annotated[float, Field(ge=0, lt=1)]
    min_window_latencies: Annotated[float, Field(gt=0)]

    def as_dict(self) -> dict[str, float]:
        return {"tolerance": self.tolerance, "min_window_latencies": self.min_window_latencies}


def _slo(value: Any) -> Any:
    return value if isinstance(value, SloSpec) else slo_from_mapping(value, where="bench.slo")


def _prices(value: Any) -> Any:
    return value if isinstance(value, Prices) else prices_from_mapping(value, where="bench.prices")


class BenchConfig(Section):
    """Settings of the benchmark stage: which results, the SLO, prices and the checks."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=True, allow_inf_nan=False, arbitrary_types_allowed=True
    )

    results: tuple_of(ConfigPath)  # type: ignore[valid-type]
    manifest: ConfigPath | None
    slo: Annotated[SloSpec, BeforeValidator(_slo)]
    overload: OverloadRule
    min_tail_requests: NonNegativeInt
    interpolate: bool
    prices: Annotated[Prices, BeforeValidator(_prices)]
    as_of: ConfigDate | None
    max_age_days: PositiveInt
    peak_window: Annotated[str, Field(min_length=1)]
    length_factor: Annotated[float, Field(gt=1)]
    tail_ratio: Annotated[float, Field(gt=1)]

    def as_dict(self) -> dict[str, Any]:
        return {
            "results": [str(p) for p in self.results],
            "manifest": str(self.manifest) if self.manifest else None,
            "slo": self.slo.as_dict(),
            "interpolate": self.interpolate,
            "prices": self.prices.as_dict(),
            "as_of": self.as_of.isoformat() if self.as_of else None,
            "max_age_days": self.max_age_days,
            "peak_window": self.peak_window,
            "length_factor": self.length_factor,
            "tail_ratio": self.tail_ratio,
            "overload": self.overload.as_dict(),
            "min_tail_requests": self.min_tail_requests,
        }


RUN_DATE_ENV = "ENGINEFIT_RUN_DATE"


def as_of_flag(flag_value: str | None, settings: BenchConfig) -> tuple[str, str] | None:
    """The date age checks count from, as a settings override ``(where, value)`` for
    :func:`pipeline.settings.with_flags`: ``--as-of``, else ``ENGINEFIT_RUN_DATE`` when
    ``bench.as_of`` is not configured; None keeps the configuration's (commands never read the
    clock)."""
    if flag_value is not None:
        return ("--as-of", flag_value)
    if settings.as_of is None and os.environ.get(RUN_DATE_ENV):
        return (RUN_DATE_ENV, os.environ[RUN_DATE_ENV])
    return None


def parse_as_of(value: Any, where: str) -> dt.date:
    """An ISO date (``2026-11-29``) given on the command line or in the environment."""
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    try:
        return dt.date.fromisoformat(str(value).strip())
    except ValueError as exc:
        raise ConfigError(f"{where}: {value!r} is not an ISO date (YYYY-MM-DD)") from exc
