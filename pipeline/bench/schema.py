"""The normalised benchmark table: one row per *load point* (one benchmark run at one load).

Every reader in :mod:`pipeline.bench.readers` turns a tool's result file into rows with exactly
these columns, in this order, with these dtypes, so everything after the readers sees one table
whatever tool wrote the file; per-request rows, when a file has them, go to a second table.
Units are in the column names: every latency in milliseconds, every rate per second. What each
column means and where each tool's value comes from: docs/bench.md ("The load-point table").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from pipeline.schema import conform_to

LATENCY_METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2e")
LATENCY_STATS: tuple[str, ...] = ("mean", "p50", "p90", "p95", "p99", "max")
# percentile name -> q in [0, 1]
PERCENTILES: dict[str, float] = {"p50": 0.50, "p90": 0.90, "p95": 0.95, "p99": 0.99}


def _latency_columns() -> dict[str, pl.DataType]:
    cols: dict[str, pl.DataType] = {}
    for metric in LATENCY_METRICS:
        for stat in LATENCY_STATS:
            cols[f"{metric}_{stat}_ms"] = pl.Float64()
        cols[f"{metric}_source"] = pl.String()
    return cols


LOAD_POINT_SCHEMA: pl.Schema = pl.Schema(
    {
        # lineage
        "point_id": pl.String(),
        "tool": pl.String(),
        "tool_version": pl.String(),
        "source_schema": pl.String(),
        "source_file": pl.String(),
        "source_sha256": pl.String(),
        "record_index": pl.Int64(),
        "manifest_file": pl.String(),
        # files the reader opened beside the result file (a JSON object: path -> sha256)
        "companion_files": pl.String(),
        # system under test
        "engine": pl.String(),
        "engine_version": pl.String(),
        "backend": pl.String(),
        "gpu_type": pl.String(),
        "gpu_count": pl.Int64(),
        "quantization": pl.String(),
        "price_per_gpu_hour_usd": pl.Float64(),
        "workload": pl.String(),
        "label": pl.String(),
        "model": pl.String(),
        "client_protocol": pl.String(),
        "dataset": pl.String(),
        "run_date": pl.Date(),
        "started_at": pl.Datetime("us", "UTC"),
        # load
        "load_mode": pl.String(),
        "arrival_process": pl.String(),
        "offered_rate_rps": pl.Float64(),
        "achieved_rate_rps": pl.Float64(),
        "burstiness": pl.Float64(),
        "concurrency": pl.Int64(),
        "mean_concurrency": pl.Float64(),
        # counts and throughput
        "num_requests": pl.Int64(),
        "completed": pl.Int64(),
        "failed": pl.Int64(),
        "incomplete": pl.Int64(),
        "error_rate": pl.Float64(),
        "duration_s": pl.Float64(),
        "duration_kind": pl.String(),
        "total_input_tokens": pl.Int64(),
        "total_output_tokens": pl.Int64(),
        "output_tokens_source": pl.String(),
        "request_throughput_rps": pl.Float64(),
        "input_tokens_per_s": pl.Float64(),
        "output_tokens_per_s": pl.Float64(),
        "total_tokens_per_s": pl.Float64(),
        "goodput_rps": pl.Float64(),
        "goodput_slo": pl.String(),
        # prompt / output lengths
        "input_tokens_mean": pl.Float64(),
        "input_tokens_p50": pl.Float64(),
        "input_tokens_p99": pl.Float64(),
        "output_tokens_mean": pl.Float64(),
        "output_tokens_p50": pl.Float64(),
        "output_tokens_p99": pl.Float64(),
        "input_len_fixed": pl.Boolean(),
        "output_len_fixed": pl.Boolean(),
        "input_len_target": pl.Int64(),
        "output_len_target": pl.Int64(),
        # latency families
        **_latency_columns(),
        "tpot_definition": pl.String(),
        "itl_definition": pl.String(),
        "native_stats": pl.String(),
        "percentile_method": pl.String(),
        # misc
        "has_per_request": pl.Boolean(),
        "file_metadata": pl.String(),
        "engine_args": pl.String(),
        "recorded_engine_args": pl.String(),
        "row_notes": pl.List(pl.String()),
        "rejected_values": pl.List(pl.String()),
    }
)

PER_REQUEST_SCHEMA: pl.Schema = pl.Schema(
    {
        "point_id": pl.String(),
        "source_file": pl.String(),
        "record_index": pl.Int64(),
        "request_index": pl.Int64(),
        "ok": pl.Boolean(),
        "start_s": pl.Float64(),
        "ttft_ms": pl.Float64(),
        "e2e_ms": pl.Float64(),
        "tpot_ms": pl.Float64(),
        "itl_ms": pl.List(pl.Float64()),
        "input_tokens": pl.Int64(),
        "output_tokens": pl.Int64(),
        "error": pl.String(),
    }
)


@dataclass(frozen=True)
class BenchReadResult:
    """What :func:`pipeline.bench.read_bench_files` returns.

    ``load_points`` has ``LOAD_POINT_SCHEMA`` and is sorted by (``source_file``,
    ``record_index``). ``per_request`` has ``PER_REQUEST_SCHEMA`` (sorted by ``point_id``,
    ``request_index``) or is None when no file had per-request data. ``notes`` are
    human-readable remarks about the read (files detected as cross-stage summaries and skipped,
    recomputations, mismatches), in input order.
    """

    load_points: pl.DataFrame
    per_request: pl.DataFrame | None
    notes: list[str] = field(default_factory=list)


def conform_load_points(frame: pl.DataFrame) -> pl.DataFrame:
    return conform_to(frame, LOAD_POINT_SCHEMA)


def conform_per_request(frame: pl.DataFrame) -> pl.DataFrame:
    return conform_to(frame, PER_REQUEST_SCHEMA)


#: Measured columns that no run can make negative, NaN or infinite (``offered_rate_rps`` may
#: be +inf: everything sent at once); ``error_rate`` must also be at most 1.
NON_NEGATIVE_COLUMNS: tuple[str, ...] = (
    *(f"{m}_{s}_ms" for m in LATENCY_METRICS for s in LATENCY_STATS),
    "offered_rate_rps",
    "achieved_rate_rps",
    "burstiness",
    "concurrency",
    "mean_concurrency",
    "num_requests",
    "completed",
    "failed",
    "incomplete",
    "error_rate",
    "duration_s",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput_rps",
    "input_tokens_per_s",
    "output_tokens_per_s",
    "total_tokens_per_s",
    "goodput_rps",
    *(f"{side}_tokens_{s}" for side in ("input", "output") for s in ("mean", "p50", "p99")),
    "input_len_target",
    "output_len_target",
)


#: Why a NaN is listed: a value the tool did not measure, not an impossible one.
NOT_A_NUMBER = "not a number"


def _problem(column: str) -> pl.Expr:
    """Why ``column``'s value is impossible (null when it is fine or unknown)."""
    x = pl.col(column).cast(pl.Float64)
    why = pl.when(x.is_nan()).then(pl.lit(NOT_A_NUMBER)).when(x < 0).then(pl.lit("negative"))
    if column != "offered_rate_rps":
        why = why.when(x.is_infinite()).then(pl.lit("infinite"))
    if column == "error_rate":
        why = why.when(x > 1).then(pl.lit("above 1"))
    return why.otherwise(None)


def screen_measurements(points: pl.DataFrame) -> pl.DataFrame:
    """Impossible measured values (:data:`NON_NEGATIVE_COLUMNS`) set to null and each listed in
    ``rejected_values`` (added to what an earlier screen listed; screening twice changes
    nothing)."""
    problems = {c: _problem(c) for c in NON_NEGATIVE_COLUMNS if c in points.columns}
    entries = [
        pl.when(why.is_not_null()).then(pl.format(f"{c} = {{}} is {{}}", pl.col(c), why))
        for c, why in problems.items()
    ]
    earlier = (
        pl.col("rejected_values").fill_null([])
        if "rejected_values" in points.columns
        else pl.lit([], dtype=pl.List(pl.String()))
    )
    return points.with_columns(
        rejected_values=pl.concat_list([earlier, *entries]).list.drop_nulls(),
        **{c: pl.when(why.is_null()).then(pl.col(c)) for c, why in problems.items()},
    )


def impossible_values(frame: pl.DataFrame) -> pl.Expr:
    """``rejected_values`` without the NaNs: a NaN is a value the tool did not measure (treated
    as missing), the others are values no run can produce, which leave the record untrusted."""
    if "rejected_values" not in frame.columns:
        return pl.lit([], dtype=pl.List(pl.String()))
    entries = pl.col("rejected_values").fill_null([])
    return entries.list.eval(
        pl.element().filter(~pl.element().str.ends_with(f" is {NOT_A_NUMBER}"))
    )


def rejected_notes(points: pl.DataFrame) -> list[str]:
    """One note per screened point, naming its file (in the point id) and the values."""
    return [
        f"{point_id}: {'; '.join(values)}: not a possible measurement, treated as unknown"
        for point_id, values in points.select("point_id", "rejected_values").iter_rows()
        if values
    ]


def empty_load_points() -> pl.DataFrame:
    return pl.DataFrame(schema=LOAD_POINT_SCHEMA)
