"""What the shape stage produces: the metrics document, the facts later stages read, and the
frames behind the plots.

:class:`ShapeMetrics` is ``workload_shape.json`` (keys in ``docs/shape.md``) as a typed model;
it round-trips through JSON (:meth:`ShapeResult.to_json` / :meth:`ShapeResult.from_json`), and
the typed views other stages read (:attr:`ShapeResult.facts`, :attr:`ShapeResult.findings`)
are derived from it, so a result read back from disk is the same result. A statistic the
timestamps or columns cannot support is :class:`Unknown` in memory and ``supported``/``known``/
``logged: false`` with its ``reason`` on disk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

import polars as pl
from pydantic import (
    BeforeValidator,
    SerializerFunctionWrapHandler,
    WrapSerializer,
    field_serializer,
    model_serializer,
)

from pipeline.shape.arrivals import WINDOWS_S, Quantisation, window_label
from pipeline.shape.config import RecordedShapeConfig
from pipeline.shape.facts import LatencyModel, Percentiles, WorkloadFacts
from pipeline.shape.findings import Finding
from pipeline.unknown import ResultModel, Unknown, is_known

_NAN_PERCENTILES = Percentiles(p50=math.nan, p90=math.nan, p95=math.nan, p99=math.nan, max=math.nan)
_WINDOW_SECONDS = {window_label(w): w for w in WINDOWS_S}


def _unknown_unless(flag: str) -> tuple[BeforeValidator, WrapSerializer]:
    """How a statistic that may be unsupported is read and written: ``{flag: false, reason}``
    on disk is ``Unknown(reason)`` in memory; a supported one is written with ``flag: true``."""

    def read(value: Any) -> Any:
        if not isinstance(value, dict) or flag not in value:
            return value
        if not value[flag]:
            return Unknown(reason=str(value["reason"]))
        return {k: v for k, v in value.items() if k != flag}

    def write(value: Any, handler: SerializerFunctionWrapHandler) -> Any:
        if isinstance(value, Unknown):
            return {flag: False, "reason": value.reason}
        return {flag: True, **handler(value)}

    return BeforeValidator(read), WrapSerializer(write)


_SUPPORTED_IN, _SUPPORTED_OUT = _unknown_unless("supported")
_KNOWN_IN, _KNOWN_OUT = _unknown_unless("known")
_LOGGED_IN, _LOGGED_OUT = _unknown_unless("logged")

# What only the shape stage itself reads (its tables and figures): kept as the document it
# computed, inside a typed "supported or Unknown" envelope.
Statistics = dict[str, Any]


class WindowCounts(ResultModel):
    """Request counts in tumbling windows of ``window_s`` seconds."""

    window_s: int
    bins: int
    mean_count: float
    variance: float
    index_of_dispersion: float | None
    peak_count: int
    peak_rate_rps: float
    peak_window_start: str


class Arrivals(ResultModel):
    requests: int
    first: str
    last: str
    span_s: float
    mean_rate_rps: float | None  # None: every request arrives at one instant
    quantisation: Quantisation
    windows: dict[str, Annotated[WindowCounts | Unknown, _SUPPORTED_IN]]
    inter_arrival: Annotated[Statistics | Unknown, _SUPPORTED_IN, _SUPPORTED_OUT]
    hour_of_day: Annotated[Statistics | Unknown, _SUPPORTED_IN, _SUPPORTED_OUT]
    day_of_week: Annotated[Statistics | Unknown, _SUPPORTED_IN, _SUPPORTED_OUT]

    @field_serializer("windows", mode="wrap")
    def _windows(
        self, windows: dict[str, WindowCounts | Unknown], handler: SerializerFunctionWrapHandler
    ) -> dict[str, Any]:
        # An unsupported window still says which window it is (``window_s``).
        return {
            label: (
                {"supported": False, "reason": w.reason, "window_s": _WINDOW_SECONDS[label]}
                if isinstance(w, Unknown)
                else {"supported": True, **w.model_dump()}
            )
            for label, w in windows.items()
        }

    def peak_rates(self) -> dict[str, float]:
        """Peak requests/s per supported window label."""
        return {k: w.peak_rate_rps for k, w in self.windows.items() if is_known(w)}


class Distribution(ResultModel):
    """count, min, mean, percentiles and max of a column (None when it was never logged);
    ``p99_over_p50`` None also when p50 is 0 and p99 is not."""

    count: int
    min: float | None
    mean: float | None
    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    max: float | None
    p99_over_p50: float | None

    def percentiles(self) -> Percentiles:
        """All NaN when the column was never logged."""
        if not self.count:
            return _NAN_PERCENTILES
        return Percentiles(
            *(float(v or 0.0) for v in (self.p50, self.p90, self.p95, self.p99, self.max))
        )


class OutputDistribution(Distribution):
    logged: bool


class LongContext(ResultModel):
    requests: int
    share: float | None


class Lengths(ResultModel):
    prompt_tokens: Distribution
    output_tokens: OutputDistribution
    long_context: dict[str, LongContext]


class ConcurrencyQuantisation(ResultModel):
    affected: bool
    quantum_s: float | None
    note: str | None


class Concurrency(ResultModel):
    peak: int
    peak_at: str | None
    mean: float | None
    estimated: bool
    label: str
    durations_logged: int
    durations_estimated: int
    latency_model: LatencyModel | None  # None: every duration was logged
    tie_order: str
    quantisation: ConcurrencyQuantisation


class CategoryCount(ResultModel):
    value: str
    requests: int
    share: float


class Categories(ResultModel):
    """A logged category column (tenant, model): how many distinct values, the largest."""

    logged: bool
    distinct: int
    requests_logged: int
    requests_unlogged: int
    top: list[CategoryCount]


class FlagFeature(ResultModel):
    logged_rows: int
    requests: int
    share_of_logged: float | None


class LoraFeature(ResultModel):
    requests: int
    distinct_adapters: int
    share: float | None


class Features(ResultModel):
    structured_output: FlagFeature
    tools: FlagFeature
    lora_adapter: LoraFeature


class ProviderCache(ResultModel):
    rows_logged: int
    cached_tokens: int
    prompt_tokens: int
    cached_share: float | None


class SketchedPercentiles(ResultModel):
    """How the percentiles of a table above the exact limit were computed."""

    relative_error: float
    method: str
    requests: int
    exact_max_requests: int


class ShapeMetrics(ResultModel):
    """``workload_shape.json``."""

    schema_version: int
    percentile_method: str
    requests: int
    arrivals: Arrivals
    lengths: Lengths
    concurrency: Concurrency
    sessions: Annotated[Statistics | Unknown, _KNOWN_IN, _KNOWN_OUT]
    tenants: Categories
    models: Categories
    features: Features
    provider_cache: Annotated[ProviderCache | Unknown, _LOGGED_IN, _LOGGED_OUT]
    config: RecordedShapeConfig
    findings: list[Finding]
    # Present only when the percentiles were sketched (a table above the exact limit).
    percentiles_sketched: SketchedPercentiles | None = None

    @model_serializer(mode="wrap")
    def _without_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if out.get("percentiles_sketched") is None:
            out.pop("percentiles_sketched", None)
        return out


@dataclass(frozen=True)
class ShapePlotData:
    """What the figures draw (computed with the metrics; not persisted on its own)."""

    length_cdfs: dict[str, pl.DataFrame]  # "prompt"/"output" → value, share
    arrival_series: pl.DataFrame  # bucket_start, requests
    arrival_bucket_s: float


@dataclass(frozen=True)
class ShapeResult:
    metrics: ShapeMetrics
    concurrency_series: pl.DataFrame
    plots: ShapePlotData | None = None

    def to_json(self) -> dict[str, Any]:
        return self.metrics.model_dump(mode="json")

    @classmethod
    def from_json(cls, metrics: Any, concurrency_series: pl.DataFrame | None = None) -> ShapeResult:
        series = concurrency_series if concurrency_series is not None else pl.DataFrame()
        return cls(metrics=ShapeMetrics.model_validate(metrics), concurrency_series=series)

    @property
    def findings(self) -> tuple[Finding, ...]:
        return tuple(self.metrics.findings)

    @property
    def facts(self) -> WorkloadFacts:
        """The numbers later stages read (unsupported rate windows left out; NaN = unknown)."""
        m = self.metrics
        conc = m.concurrency
        return WorkloadFacts(
            requests=m.requests,
            span_s=m.arrivals.span_s,
            mean_rate_rps=math.nan
            if m.arrivals.mean_rate_rps is None
            else m.arrivals.mean_rate_rps,
            peak_rate_rps=m.arrivals.peak_rates(),
            prompt_tokens=m.lengths.prompt_tokens.percentiles(),
            output_tokens=m.lengths.output_tokens.percentiles(),
            peak_concurrency=float(conc.peak),
            peak_concurrency_estimated=conc.estimated,
            latency_model=conc.latency_model,
            tenants=m.tenants.distinct if m.tenants.logged else None,
            models=tuple(sorted(r.value for r in m.models.top)),
        )
