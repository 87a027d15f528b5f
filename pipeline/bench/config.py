"""The ``bench`` section of ``enginefit.yaml`` (defaults and their documentation:
``pipeline/defaults.yaml``).

The SLO specification and its parsers (``bench.slo`` and ``--slo``) live here, with the section
they configure; :mod:`pipeline.bench.slo` evaluates load points against it. The price table keeps
its own domain type (:class:`~pipeline.costing.Prices`). Errors name the key.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, PlainSerializer

from pipeline.costing import Prices, prices_from_mapping
from pipeline.dates import not_in_future
from pipeline.errors import ConfigError
from pipeline.settings import (
    ConfigDate,
    ConfigPath,
    Section,
    between,
    collected,
    tuple_of,
)

ITL_DEFINITIONS: dict[str, str] = {
    # per-gap: one sample per gap between streamed chunks, pooled (vLLM/SGLang ITL).
    "per-gap": "itl",
    # per-request: (e2e - ttft) / (output tokens - 1) per request (vLLM TPOT, genai-perf ITL).
    "per-request": "tpot",
}
STATS = ("mean", "p50", "p90", "p95", "p99")
METRICS = ("ttft", "itl", "e2e")
_LIMIT_KEY = re.compile(r"^(ttft|itl|e2e)_(mean|p50|p90|p95|p99)_ms$")
_OPTION_KEYS = ("itl_definition", "max_error_rate", "min_achieved_rate_share")
_METRIC_LABEL = {"ttft": "TTFT", "itl": "ITL", "e2e": "E2E"}
# A latency limit past an hour judges nothing (no benchmark runs a request that long).
MAX_LATENCY_LIMIT_MS = 3_600_000.0
# Benchmarks stay current this many days at most: ten years is past any engine's release cycle.
MAX_AGE_DAYS_LIMIT = 3_650
# A point's window spans at most this many typical latencies before the rule asks the impossible.
MAX_WINDOW_LATENCIES = 1_000.0
# k in ceil(k / (1 - q)): a hundred already asks 10,000 requests of a p99.
MAX_TAIL_REQUESTS = 100


class SloSpecError(ConfigError):
    """An SLO specification (config ``bench.slo`` or ``--slo``) is malformed."""


@dataclass(frozen=True)
class LatencyLimit:
    """``<metric>_<stat>_ms <= max_ms``, e.g. p95 TTFT at most 1000 ms."""

    metric: str  # ttft | itl | e2e
    stat: str  # mean | p50 | p90 | p95 | p99
    max_ms: float

    @property
    def key(self) -> str:
        return f"{self.metric}_{self.stat}_ms"

    def column(self, itl_definition: str) -> str:
        """The load-point column this limit reads (ITL depends on the definition)."""
        family = ITL_DEFINITIONS[itl_definition] if self.metric == "itl" else self.metric
        return f"{family}_{self.stat}_ms"

    def label(self, itl_definition: str) -> str:
        name = _METRIC_LABEL[self.metric]
        if self.metric == "itl":
            name = f"ITL ({itl_definition})"
        return f"{self.stat} {name}"


@dataclass(frozen=True)
class SloSpec:
    """A service-level objective. ``<=`` throughout: a value equal to its limit passes."""

    limits: tuple[LatencyLimit, ...]
    itl_definition: str
    #: failed / (completed + failed) must be at most this; None = not checked.
    max_error_rate: float | None
    #: achieved send rate / offered rate below this makes a point unknown (the client did not
    #: offer the load it claims); None = not checked. Only where both rates are recorded.
    min_achieved_rate_share: float | None

    def columns(self) -> list[str]:
        return [limit.column(self.itl_definition) for limit in self.limits]

    def describe(self) -> str:
        parts = [
            f"{limit.label(self.itl_definition)} ≤ {format_bound(limit.max_ms)} ms"
            for limit in self.limits
        ]
        if self.max_error_rate is not None:
            parts.append(f"error rate ≤ {format_bound(self.max_error_rate * 100)}%")
        if self.min_achieved_rate_share is not None:
            parts.append(
                f"achieved send rate ≥ {format_bound(self.min_achieved_rate_share * 100)}% of offered"
            )
        return ", ".join(parts) if parts else "no limits"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {limit.key: limit.max_ms for limit in self.limits}
        out["itl_definition"] = self.itl_definition
        out["max_error_rate"] = self.max_error_rate
        out["min_achieved_rate_share"] = self.min_achieved_rate_share
        out["description"] = self.describe()
        return out


def is_limit_key(name: str) -> bool:
    """``ttft_p95_ms`` and the like: a latency limit, as opposed to an SLO option."""
    return _LIMIT_KEY.match(name.strip()) is not None


def format_bound(value: float) -> str:
    """A limit as the SLO text writes it (1000, 0.5)."""
    return f"{value:g}"


# --------------------------------------------------------------------------------------------
# Parsing


def _number(value: Any, key: str, where: str) -> float | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null", "")):
        return None
    if isinstance(value, bool):
        raise SloSpecError(f"{where}: {key} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise SloSpecError(f"{where}: {key} must be a number, got {value!r}") from exc
    if not math.isfinite(number) or number < 0:
        raise SloSpecError(f"{where}: {key} must be a finite number ≥ 0, got {value!r}")
    return number


def slo_from_mapping(
    raw: Mapping[str, Any], *, where: str = "bench.slo", base: SloSpec | None = None
) -> SloSpec:
    """Build an SLO from a mapping of ``<metric>_<stat>_ms`` limits and options.

    Latency keys: ``ttft|itl|e2e`` × ``mean|p50|p90|p95|p99``, e.g. ``ttft_p95_ms``; a null value
    disables that limit. Options: ``itl_definition`` (``per-gap`` | ``per-request``),
    ``max_error_rate`` (0..1 or null), ``min_achieved_rate_share`` (0..1 or null); an option not
    given is taken from ``base`` (the configured SLO, for ``--slo``) and must otherwise be given
    (the configuration file supplies them from its defaults). A mapping with no latency key at
    all is an error: an SLO that checks no latency passes everything.
    """
    if not isinstance(raw, Mapping):
        raise SloSpecError(f"{where}: must be a mapping of limits, got {type(raw).__name__}")
    limits: list[LatencyLimit] = []
    options: dict[str, Any] = {}
    for key in sorted(raw, key=str):
        value = raw[key]
        name = str(key).strip()
        match = _LIMIT_KEY.match(name)
        if match:
            bound = _number(value, f"{where}.{name}", where)
            if bound is not None and bound > MAX_LATENCY_LIMIT_MS:
                raise SloSpecError(
                    f"{where}.{name}: a latency limit is at most {MAX_LATENCY_LIMIT_MS:,.0f} ms "
                    f"(an hour), got {value!r}"
                )
            if bound is not None:
                limits.append(LatencyLimit(match.group(1), match.group(2), bound))
        elif name in _OPTION_KEYS:
            options[name] = value
        else:
            raise SloSpecError(
                f"{where}: unknown key {name!r}; expected <ttft|itl|e2e>_<mean|p50|p90|p95|p99>_ms "
                f"(e.g. ttft_p95_ms) or one of {', '.join(_OPTION_KEYS)}"
            )
    if not limits:
        raise SloSpecError(
            f"{where}: no latency limit given (e.g. ttft_p95_ms=1000,itl_p99_ms=60); "
            "an SLO without limits would pass every load point"
        )
    for name in _OPTION_KEYS:
        if name not in options:
            if base is None:
                raise SloSpecError(f"{where}.{name} is required")
            options[name] = getattr(base, name)
    itl_definition = str(options["itl_definition"]).strip()
    if itl_definition not in ITL_DEFINITIONS:
        raise SloSpecError(
            f"{where}.itl_definition: {itl_definition!r} is not one of "
            f"{', '.join(sorted(ITL_DEFINITIONS))} (per-gap = pooled chunk gaps, vLLM/SGLang ITL; "
            "per-request = (e2e - ttft)/(tokens - 1), vLLM TPOT)"
        )
    shares: dict[str, float | None] = {}
    for name in ("max_error_rate", "min_achieved_rate_share"):
        share = _number(options[name], f"{where}.{name}", where)
        if share is not None and share > 1:
            raise SloSpecError(f"{where}.{name}: must be a fraction in [0, 1], got {share:g}")
        shares[name] = share
    order = {(m, s): i for i, (m, s) in enumerate((m, s) for m in METRICS for s in STATS)}
    limits.sort(key=lambda limit: order[(limit.metric, limit.stat)])
    return SloSpec(
        limits=tuple(limits),
        itl_definition=itl_definition,
        max_error_rate=shares["max_error_rate"],
        min_achieved_rate_share=shares["min_achieved_rate_share"],
    )


def parse_slo_spec(text: str, base: SloSpec, *, where: str = "--slo") -> SloSpec:
    """Parse ``"ttft_p95_ms=1000,itl_p99_ms=60[,itl_definition=per-gap,max_error_rate=0.01]"``.

    Options not named keep their values in ``base`` (the configured SLO); the latency limits are
    exactly the ones given.
    """
    if not isinstance(text, str) or not text.strip():
        raise SloSpecError(f"{where}: empty SLO; expected e.g. ttft_p95_ms=1000,itl_p99_ms=60")
    raw: dict[str, str] = {}
    for i, item in enumerate(text.split(",")):
        item = item.strip()
        if not item:
            raise SloSpecError(f"{where}: item {i + 1} is empty (stray comma in {text!r})")
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise SloSpecError(
                f"{where}: item {i + 1} {item!r} is not KEY=VALUE (e.g. ttft_p95_ms=1000)"
            )
        if key in raw:
            raise SloSpecError(f"{where}: key {key!r} given twice")
        raw[key] = value
    return slo_from_mapping(raw, where=where, base=base)


class OverloadRule(Section):
    """When an open-loop point counts as having fallen behind (:mod:`pipeline.bench.keepup`).

    ``tolerance``: overloaded when completions kept pace with less than 1 − tolerance of sends.
    ``min_window_latencies``: the sending window must span this many early-request latencies.
    """

    tolerance: Annotated[float, Field(ge=0, lt=1)]
    min_window_latencies: Annotated[float, between(0, MAX_WINDOW_LATENCIES, low_open=True)]


def _slo(value: Any) -> Any:
    return value if isinstance(value, SloSpec) else slo_from_mapping(value, where="bench.slo")


def _prices(value: Any) -> Any:
    return value if isinstance(value, Prices) else prices_from_mapping(value, where="bench.prices")


@dataclass(frozen=True)
class BenchPolicy:
    """What the decision and the report take of the bench section besides its results: the
    report date given to this run (None: not given) and what gave it, how many days a
    benchmark stays current, and the window whose peak rate the fleet is sized for."""

    as_of: dt.date | None
    as_of_source: str
    max_age_days: int
    peak_window: str


class BenchConfig(Section):
    """Settings of the benchmark stage: which results, the SLO, prices and the checks."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=True, allow_inf_nan=False, arbitrary_types_allowed=True
    )

    # Field order is the order `enginefit config` prints them in.
    results: tuple_of(ConfigPath)  # type: ignore[valid-type]
    manifest: ConfigPath | None
    slo: Annotated[SloSpec, BeforeValidator(collected(_slo)), PlainSerializer(SloSpec.as_dict)]
    interpolate: bool
    prices: Annotated[Prices, BeforeValidator(collected(_prices)), PlainSerializer(Prices.as_dict)]
    # The report date (pipeline.dates): every age is measured from it; never in the future.
    as_of: Annotated[ConfigDate, AfterValidator(not_in_future)] | None
    max_age_days: Annotated[int, between(1, MAX_AGE_DAYS_LIMIT)]
    peak_window: Annotated[str, Field(min_length=1)]
    overload: OverloadRule
    min_tail_requests: Annotated[int, between(0, MAX_TAIL_REQUESTS)]

    def policy(self) -> BenchPolicy:
        as_of, source = configured_as_of(self)
        return BenchPolicy(as_of, source, self.max_age_days, self.peak_window)


RUN_DATE_ENV = "ENGINEFIT_RUN_DATE"


def as_of_flag(flag_value: str | None, settings: BenchConfig) -> tuple[str, str] | None:
    """The report date as a settings override ``(where, value)`` for
    :func:`pipeline.settings.with_flags`: ``--as-of``, else ``ENGINEFIT_RUN_DATE`` when
    ``bench.as_of`` is not configured; None keeps the configuration's."""
    if flag_value is not None:
        return ("--as-of", flag_value)
    if settings.as_of is None and os.environ.get(RUN_DATE_ENV):
        return (RUN_DATE_ENV, os.environ[RUN_DATE_ENV])
    return None


def configured_as_of(settings: BenchConfig) -> tuple[dt.date | None, str]:
    """The report date given to this run and where it came from: ``bench.as_of``, else
    ``ENGINEFIT_RUN_DATE``; None: not given (the decision then takes the clock's date)."""
    if settings.as_of is not None:
        return settings.as_of, "bench.as_of"
    if os.environ.get(RUN_DATE_ENV):
        return parse_as_of(os.environ[RUN_DATE_ENV], RUN_DATE_ENV), RUN_DATE_ENV
    return None, "not given"


def parse_as_of(value: Any, where: str) -> dt.date:
    """An ISO date (``2026-11-29``) given in the environment, today or earlier."""
    try:
        date = dt.date.fromisoformat(str(value).strip())
    except ValueError as exc:
        raise ConfigError(f"{where}: {value!r} is not an ISO date (YYYY-MM-DD)") from exc
    try:
        return not_in_future(date)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
