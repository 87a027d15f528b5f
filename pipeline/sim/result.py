"""What the simulation stage produces: one summary per scenario, and the capacity curves.

A :class:`ScenarioSummary` is one scenario's JSON document (keys in the README); the summaries
become ``scenarios.parquet`` (one row per scenario) and ``replicas.parquet`` (one row per
scenario and replica); the curves become ``curves.parquet`` (every step) and ``curves.json``
(log-spaced points). Hit figures of a trace without prompt content are :class:`Unknown` in
memory and ``null`` beside ``hit_unknown_reason`` on disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import polars as pl
from pydantic import SerializerFunctionWrapHandler, model_serializer, model_validator

from pipeline.shape.facts import LatencyModel
from pipeline.sim.curve import CURVE_SCHEMA, Curve
from pipeline.unknown import NullIfUnknown, ResultModel, Unknown

# The figures a trace without prompt content cannot support (``hit_unknown_reason`` says why).
_HIT_FIGURES = ("hit_tokens", "hit_ratio", "prefill_tokens")


class ReplicaSummary(ResultModel):
    """One replica's load; fields in the order of ``replicas.parquet``'s columns. Hit figures
    are null when the trace has no content (the scenario's reason says why)."""

    replica: int
    requests: int
    prompt_tokens: int
    content_prompt_tokens: int
    output_tokens: int
    hit_tokens: int | None
    prefill_tokens: int | None
    tokens: int
    hit_ratio: float | None
    peak_pinned_blocks: int
    peak_pinned_tokens: int


class DurationsLifetime(ResultModel):
    mode: Literal["durations"]
    durations_logged: int
    durations_estimated: int
    latency_model: LatencyModel | None
    replica_slots: int


class InstantLifetime(ResultModel):
    mode: Literal["instant"]
    note: str


class Durations(ResultModel):
    """How many request durations came from the latency model, when the scenario used them."""

    estimated_requests: int
    estimated: bool
    latency_model: LatencyModel | None


class CacheAwareRouter(ResultModel):
    preset: str
    overridden: list[str]
    cache_threshold: float
    balance_abs_threshold: int
    balance_rel_threshold: float
    router_view: str


class ScenarioSummary(ResultModel):
    """One scenario's replay: its key, load, cache hits and balance across replicas."""

    scenario: str
    block_size: int
    replicas: int
    cache_tokens: int
    capacity_blocks: int
    routing: str
    tenant_isolation: bool
    requests: int
    # requests simulation.request_timeout_s shed (an overloaded replica's); on disk only when
    # some were, so a replay that kept up writes what it always wrote
    shed_requests: int = 0
    prompt_tokens: int
    output_tokens: int
    content_requests: int
    content_prompt_tokens: int
    content_share: float | None
    hit_tokens: Annotated[int | Unknown, NullIfUnknown]
    hit_ratio: Annotated[float | Unknown, NullIfUnknown]
    prefill_tokens: Annotated[int | Unknown, NullIfUnknown]
    hit_tokens_instant: int | None
    hit_ratio_instant: float | None
    request_lifetime: DurationsLifetime | InstantLifetime
    peak_pinned_tokens: int
    warnings: list[str]
    spills: int
    balance_routed: int
    cache_aware: CacheAwareRouter | None
    request_imbalance: float | None
    token_imbalance: float | None
    prefill_imbalance: float | None
    per_replica: list[ReplicaSummary]
    sessions_inferred: int
    durations: Durations | None

    @model_validator(mode="before")
    @classmethod
    def _hits_unknown_with_reason(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "hit_unknown_reason" not in data:
            return data
        values = {k: v for k, v in data.items() if k != "hit_unknown_reason"}
        reason = data["hit_unknown_reason"]
        if reason is not None:
            values |= dict.fromkeys(_HIT_FIGURES, Unknown(reason=str(reason)))
        return values

    @model_serializer(mode="wrap")
    def _reason_beside_hits(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if not self.shed_requests:
            del out["shed_requests"]
        out["hit_unknown_reason"] = (
            self.hit_ratio.reason if isinstance(self.hit_ratio, Unknown) else None
        )
        return out

    def to_json(self) -> dict[str, Any]:
        return self.model_dump()

    @classmethod
    def from_json(cls, data: Any) -> ScenarioSummary:
        return cls.model_validate(data)


@dataclass(frozen=True)
class SimResult:
    summaries: list[ScenarioSummary]
    curves: list[Curve]
    curve_points: list[dict[str, Any]]  # the curves at log-spaced capacities (curves.json)


# The columns of scenarios.parquet, in order, with their types.
SCENARIO_SCHEMA = pl.Schema(
    {  # type: ignore[arg-type]  # classes and one List instance, as pipeline.schema
        "scenario": pl.String,
        "block_size": pl.Int64,
        "replicas": pl.Int64,
        "cache_tokens": pl.Int64,
        "capacity_blocks": pl.Int64,
        "routing": pl.String,
        "tenant_isolation": pl.Boolean,
        "requests": pl.Int64,
        "prompt_tokens": pl.Int64,
        "output_tokens": pl.Int64,
        "hit_tokens": pl.Int64,
        "hit_ratio": pl.Float64,
        "prefill_tokens": pl.Int64,
        "content_requests": pl.Int64,
        "content_share": pl.Float64,
        "hit_unknown_reason": pl.String,
        "request_lifetime": pl.String,
        "hit_tokens_instant": pl.Int64,
        "hit_ratio_instant": pl.Float64,
        "peak_pinned_tokens": pl.Int64,
        "warnings": pl.List(pl.String),
        "spills": pl.Int64,
        "balance_routed": pl.Int64,
        "request_imbalance": pl.Float64,
        "token_imbalance": pl.Float64,
        "prefill_imbalance": pl.Float64,
        "sessions_inferred": pl.Int64,
        "durations_estimated": pl.Boolean,
    }
)


def scenario_frame(summaries: list[ScenarioSummary]) -> pl.DataFrame:
    """One row per scenario (per-replica detail dropped), sorted by scenario key;
    ``shed_requests`` after ``requests`` when some scenario shed any."""
    schema = SCENARIO_SCHEMA
    if any(s.shed_requests for s in summaries):
        columns = list(SCENARIO_SCHEMA.items())
        at = list(SCENARIO_SCHEMA).index("requests") + 1
        schema = pl.Schema([*columns[:at], ("shed_requests", pl.Int64), *columns[at:]])
    rows = [
        {
            **{k: v for k, v in s.to_json().items() if k in schema},
            **({"shed_requests": s.shed_requests} if "shed_requests" in schema else {}),
            "request_lifetime": s.request_lifetime.mode,
            "durations_estimated": s.durations is not None and s.durations.estimated,
        }
        for s in summaries
    ]
    return pl.DataFrame(rows, schema=schema).sort("scenario")


def replica_frame(summaries: list[ScenarioSummary]) -> pl.DataFrame:
    """One row per scenario and replica."""
    rows = [{"scenario": s.scenario, **r.model_dump()} for s in summaries for r in s.per_replica]
    if not rows:
        return pl.DataFrame(schema={"scenario": pl.String, "replica": pl.Int64})
    # hit figures may be null in every row (a trace without prompt content): keep their types
    typed = {"hit_tokens": pl.Int64, "prefill_tokens": pl.Int64, "hit_ratio": pl.Float64}
    return pl.DataFrame(rows, schema_overrides=typed).sort("scenario", "replica")


# Said only of sampled curves: an exact run's table is the one it always was.
SAMPLING_COLUMNS = ("sample_rate", "hit_ratio_error")


def curves_frame(curves: list[Curve]) -> pl.DataFrame:
    frames = [c.frame() for c in curves]
    frame = (
        pl.concat(frames).sort("block_size", "replicas", "routing", "capacity_blocks")
        if frames
        else pl.DataFrame(schema=CURVE_SCHEMA)
    )
    if all(c.sample_rate >= 1 for c in curves):
        return frame.drop(SAMPLING_COLUMNS)
    return frame
