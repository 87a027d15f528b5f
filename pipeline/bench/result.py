"""What the bench stage produces: the analysis, and its JSON document (``bench_analysis.json``).

The frames (points, capacity, fleet, findings) are written as Parquet beside the document; the
document names every formula and setting it used, so an auditor reads the numbers with their
method, and later stages read the SLO and the prices the analysis was made with from it
(:class:`AnalysisBasis`), not from the configuration again.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl
from pydantic import BaseModel, ConfigDict

from pipeline.bench.config import BenchConfig, OverloadRule, SloSpec, slo_from_mapping
from pipeline.bench.validity import FINDINGS_SCHEMA
from pipeline.costing import COST_FORMULA, FLEET_FORMULA, Prices


@dataclass(frozen=True)
class AnalysisBasis:
    """The bench settings an analysis was made with, as its document records them: the SLO
    and the prices travel with the analysis to the stages after it."""

    slo: SloSpec
    prices: Prices
    overload: OverloadRule
    min_tail_requests: int
    interpolate: bool

    @classmethod
    def of(cls, settings: BenchConfig) -> AnalysisBasis:
        return cls(
            settings.slo,
            settings.prices,
            settings.overload,
            settings.min_tail_requests,
            settings.interpolate,
        )

    @classmethod
    def from_json(cls, payload: dict[str, Any], where: str) -> AnalysisBasis:
        """The settings :func:`analysis_payload` recorded (``where``: the document, for errors)."""
        slo = {key: value for key, value in payload["slo"].items() if key != "description"}
        prices = payload["prices"]
        return cls(
            slo=slo_from_mapping(slo, where=f"{where}: slo"),
            prices=Prices(
                gpu_hour_usd=dict(prices["gpu_hour_usd"]),
                default=prices["default"],
                override=prices["override"],
            ),
            overload=OverloadRule.model_validate(payload["overload"]),
            min_tail_requests=payload["min_tail_requests"],
            interpolate=payload["interpolate"],
        )


@dataclass(frozen=True)
class BenchResult:
    """Everything the bench stage computes from load points, settings and workload facts."""

    settings: AnalysisBasis
    as_of: dt.date | None
    evaluated: pl.DataFrame  # load points + sweep, load, error_rate, slo_status, slo_reason
    capacity: pl.DataFrame  # one row per candidate × sweep, with costs, rank pool and rank
    fleet: pl.DataFrame  # one row per candidate × sweep × rate
    findings: pl.DataFrame  # FINDINGS_SCHEMA
    rates: dict[str, float]
    comparable: bool
    differences: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    facts_source: str = "not recorded"  # which workload facts the checks and fleet used
    prices_source: str = "not recorded"  # where the $ per GPU-hour came from

    def capacity_rows(self, *, ranked: bool = False) -> list[CapacityRow]:
        """The capacity table in its order, or ranked: pool first, then cost, then name."""
        table = self.capacity
        if ranked:
            table = table.sort("rank_pool", "cost_rank", "candidate", nulls_last=True)
        return [CapacityRow.model_validate(row) for row in table.iter_rows(named=True)]

    def finding_rows(self) -> list[FindingRow]:
        return [FindingRow.model_validate(row) for row in self.findings.iter_rows(named=True)]


class _Row(BaseModel):
    # A view of one table row: the columns later stages read (the table has more).
    model_config = ConfigDict(extra="ignore", frozen=True)


class CapacityRow(_Row):
    """One candidate × sweep of the capacity table, as the decision and the report read it."""

    candidate: str
    sweep: str | None = None
    engine: str | None = None
    model: str | None = None
    gpu_type: str | None = None
    gpu_count: int | None = None
    gpu_hour_usd: float | None = None
    pattern: str | None = None
    capacity_status: str | None = None
    capacity_rps: float | None = None
    output_throughput_tps: float | None = None
    total_throughput_tps: float | None = None
    cost_per_1m_output_usd: float | None = None
    rank_pool: str | None = None
    # Repeat-run noise at the capacity load: (max − min) ÷ mean of the repeats' costs (null:
    # not repeated); the decision's tie band is never narrower than it.
    cost_spread: float | None = None
    repeats: int | None = None


class FindingRow(_Row):
    """One validity finding (FINDINGS_SCHEMA), as the report reads it."""

    candidate: str
    check: str
    status: str
    message: str


POINT_COLUMNS = (
    "candidate",
    "point_id",
    "sweep",
    "load",
    "offered_rate_rps",
    "achieved_rate_rps",
    "concurrency",
    "slo_status",
    "slo_reason",
    "keep_up_status",
    "keep_up_method",
    "keep_up_share",
    "keep_up_reason",
    "completed",
    "error_rate",
    "output_tokens_per_s",
    "rejected_values",
)
CAPACITY_COLUMNS = (
    "candidate",
    "sweep",
    "pattern",
    "capacity_status",
    "capacity_load",
    "first_fail_load",
    "interpolated",
    "capacity_rps",
    "sustained_rate_rps",
    "output_tokens_mean",
    "output_throughput_tps",
    "whole_run_output_tps",
    "output_rate_basis",
    "total_throughput_tps",
    "gpu_count",
    "gpu_hour_usd",
    "price_source",
    "cost_per_1m_output_usd",
    "cost_per_1m_total_usd",
    "rank_pool",
    "cost_rank",
    "repeats",
    "output_rate_spread",
    "output_rate_cv",
    "cost_spread",
    "cost_cv",
    "cost_gap_share",
    "noise_share",
    "gap_exceeds_noise",
    "noise_note",
    "cost_workings",
    "non_monotone",
    "passes_above_fail",
    "note",
)


#: The capacity columns of the Markdown table in Dagster's metadata; the payload has them all.
CAPACITY_TEXT_COLUMNS = (
    "candidate",
    "sweep",
    "pattern",
    "capacity_status",
    "capacity_rps",
    "output_throughput_tps",
    "whole_run_output_tps",
    "gpu_hour_usd",
    "price_source",
    "cost_per_1m_output_usd",
    "rank_pool",
    "cost_rank",
    "noise_note",
    "cost_workings",
    "note",
)


def _records(frame: pl.DataFrame, columns: Sequence[str]) -> list[dict[str, Any]]:
    present = [c for c in columns if c in frame.columns]
    rows = frame.select(present).to_dicts()
    for row in rows:
        for key, value in row.items():
            if isinstance(value, float) and not math.isfinite(value):
                row[key] = str(value)
            elif isinstance(value, (dt.date, dt.datetime)):
                row[key] = value.isoformat()
    return rows


def analysis_payload(analysis: BenchResult) -> dict[str, Any]:
    """A JSON-ready dict (stable ordering; non-finite floats as strings)."""
    evaluated = analysis.evaluated
    point_cols = [c for c in POINT_COLUMNS if c in evaluated.columns]
    slo_cols = [c for c in analysis.settings.slo.columns() if c in evaluated.columns]
    points = evaluated.sort(["candidate", "sweep", "load", "point_id"], nulls_last=True)
    return {
        "as_of": analysis.as_of.isoformat() if analysis.as_of else None,
        "workload_facts": analysis.facts_source,
        "prices_source": analysis.prices_source,
        "slo": analysis.settings.slo.as_dict(),
        "overload": analysis.settings.overload.model_dump(mode="json"),
        "min_tail_requests": analysis.settings.min_tail_requests,
        "interpolate": analysis.settings.interpolate,
        "prices": analysis.settings.prices.as_dict(),
        "formulas": {"cost": COST_FORMULA, "fleet": FLEET_FORMULA},
        "comparable": analysis.comparable,
        "differences": analysis.differences,
        "rates_rps": analysis.rates,
        "capacity": _records(analysis.capacity, CAPACITY_COLUMNS),
        "fleet": _records(analysis.fleet, analysis.fleet.columns),
        "findings": _records(analysis.findings, list(FINDINGS_SCHEMA)),
        "points": _records(points, [*point_cols, *slo_cols]),
        "notes": analysis.notes,
    }
