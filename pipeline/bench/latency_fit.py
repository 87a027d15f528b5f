"""Latency models fitted from benchmark results, and the trace's concurrency re-estimated with them.

No public trace logs request durations, so the workload-shape stage estimates peak concurrency
from a :class:`~pipeline.shape.facts.LatencyModel` whose parameters come from configuration. Once
benchmark results are joined, each candidate deployment gives its own parameters:

Which load point
    The point **at the candidate's SLO capacity** (``capacity_point_id`` of
    :func:`pipeline.bench.slo.slo_capacity`: the measured highest passing load below the first
    failure, never an interpolated one). That is the operating point the fleet sizing assumes, so
    its latencies include the queueing the fleet will see when it runs at capacity; a lightly
    loaded point would understate durations, and so concurrency.

TPOT
    ``tpot_ms`` = the point's TPOT p50 (per-request decode time per token). When the tool gave
    no TPOT, the per-gap ITL *mean* is used instead and ``tpot_from`` says so. Not the ITL
    median: per-gap ITL pools the gaps between streamed chunks, and with multi-token chunks most
    gaps are near zero, while the mean gap is decode time over gaps, close to the per-token time
    (docs/bench.md has a sweep's figures).

TTFT as a function of prompt tokens
    One load point has one mean prompt length, so base and slope cannot both be fitted: the
    base is 0 and ``ttft_per_prompt_token_ms`` = TTFT p50 ÷ the benchmark's mean input tokens.
    This scales TTFT linearly with prompt length through the origin; when the trace's prompts
    are much longer or shorter than the benchmark's, ``note`` says how far it extrapolates.
    The other passing points of a sweep are not used for a least-squares line: they sit at
    lower loads (less queueing) and, in every sweep we have, at the same prompt length.

A candidate without an SLO capacity, or whose capacity point lacks TTFT p50, the mean input
length or both TPOT p50 and ITL mean, gets no model and a ``reason``; nothing falls back to a
default silently. Every concurrency figure computed with a model is an estimate and carries the
model's parameters and ``source`` (``benchmark:<candidate> at <load> req/s``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import polars as pl

from pipeline.bench.frames import column_or_null, float_column
from pipeline.bench.slo import candidate_keys
from pipeline.bench.validity import candidate_label_expr
from pipeline.present.tables import markdown_table
from pipeline.present.text import decimal_expr
from pipeline.shape.concurrency import ConcurrencyResult, peak_concurrency
from pipeline.shape.facts import LatencyModel

#: Trace mean prompt/output length beyond this factor of the benchmark's is called extrapolation.
EXTRAPOLATION_FACTOR = 2.0
CONFIG_LABEL = "(config: shape.latency_model)"

METHOD = (
    "latency model per candidate from its load point at the SLO capacity (highest passing "
    "measured load, queueing included): tpot_ms = TPOT p50 (else the mean per-gap ITL, see "
    "tpot_from); ttft_base_ms = 0 and ttft_per_prompt_token_ms = TTFT p50 / mean input tokens "
    "(one point cannot fit a base and a slope); duration = ttft_base_ms + "
    "ttft_per_prompt_token_ms x prompt tokens + tpot_ms x (output tokens - 1); concurrency by the "
    "shape stage's sweep (pipeline.shape.concurrency.peak_concurrency)"
)

FIT_SCHEMA: dict[str, pl.DataType] = {
    "candidate": pl.String(),
    "sweep": pl.String(),
    "capacity_status": pl.String(),
    "capacity_load": pl.Float64(),
    "point_id": pl.String(),
    "ttft_p50_ms": pl.Float64(),
    "tpot_p50_ms": pl.Float64(),
    "itl_mean_ms": pl.Float64(),
    "input_tokens_mean": pl.Float64(),
    "output_tokens_mean": pl.Float64(),
    "fitted": pl.Boolean(),
    "ttft_base_ms": pl.Float64(),
    "ttft_per_prompt_token_ms": pl.Float64(),
    "tpot_ms": pl.Float64(),
    "tpot_from": pl.String(),
    "source": pl.String(),
    "reason": pl.String(),
}

CONCURRENCY_SCHEMA: dict[str, pl.DataType] = {
    "model": pl.String(),  # "config" | "benchmark"
    "candidate": pl.String(),
    "sweep": pl.String(),
    "source": pl.String(),
    "ttft_base_ms": pl.Float64(),
    "ttft_per_prompt_token_ms": pl.Float64(),
    "tpot_ms": pl.Float64(),
    "tpot_from": pl.String(),
    "point_id": pl.String(),
    "peak_concurrency": pl.Int64(),
    "peak_at": pl.Datetime("us", "UTC"),
    "mean_concurrency": pl.Float64(),
    "estimated": pl.Boolean(),
    "durations_estimated": pl.Int64(),
    "peak_vs_config": pl.Float64(),
    "label": pl.String(),
    "reason": pl.String(),
    "note": pl.String(),
}


def _str(frame: pl.DataFrame, name: str) -> pl.Expr:
    return column_or_null(frame, name, pl.String())


def empty_fits() -> pl.DataFrame:
    return pl.DataFrame(schema=FIT_SCHEMA)


def fit_latency_models(evaluated: pl.DataFrame, capacity: pl.DataFrame) -> pl.DataFrame:
    """One row per candidate × sweep of ``capacity``: the fitted model's parameters or a reason.

    ``evaluated`` is :func:`pipeline.bench.slo.evaluate_slo`'s output (the load points),
    ``capacity`` is :func:`pipeline.bench.slo.slo_capacity`'s (with or without the ``candidate``
    label of :mod:`pipeline.bench.validity`). Columns: :data:`FIT_SCHEMA` after the candidate
    keys; rows sorted by candidate and sweep. See the module docstring for the method.
    """
    if capacity.is_empty():
        return empty_fits()
    keys = candidate_keys(capacity)
    cap = capacity.with_columns(
        candidate=pl.col("candidate").cast(pl.String)
        if "candidate" in capacity.columns
        else candidate_label_expr(capacity),
        point_id=_str(capacity, "capacity_point_id"),
        sweep=_str(capacity, "sweep"),
        capacity_status=_str(capacity, "capacity_status"),
        capacity_load=float_column(capacity, "capacity_load"),
    ).select(*keys, "candidate", "sweep", "capacity_status", "capacity_load", "point_id")
    measures = ("ttft_p50_ms", "tpot_p50_ms", "itl_mean_ms", "input_tokens_mean")
    points = (
        evaluated.select(
            _str(evaluated, "point_id").alias("point_id"),
            *(float_column(evaluated, c).alias(c) for c in (*measures, "output_tokens_mean")),
        )
        .filter(pl.col("point_id").is_not_null())
        .unique(subset="point_id", keep="first", maintain_order=True)
    )
    frame = cap.join(points, on="point_id", how="left")
    has_capacity = (
        pl.col("sweep").is_in(["open", "closed"]).fill_null(False)
        & pl.col("point_id").is_not_null()
        & pl.col("capacity_load").is_not_null()
    )
    ttft, tpot, itl, inp = (pl.col(c) for c in measures)
    at = pl.format(" at point {}", pl.col("point_id"))
    reason = (
        pl.when(~has_capacity)
        .then(
            pl.format(
                "no SLO capacity (capacity_status {}): no load point to fit",
                pl.col("capacity_status").fill_null("unknown"),
            )
        )
        .otherwise(
            pl.concat_str(
                [
                    pl.when(ttft.is_null()).then(pl.lit("TTFT p50 missing")),
                    pl.when(inp.is_null())
                    .then(pl.lit("mean input tokens missing"))
                    .when(inp <= 0)
                    .then(pl.format("mean input tokens is {}", inp)),
                    pl.when(tpot.is_null() & itl.is_null()).then(
                        pl.lit("TPOT p50 and ITL mean both missing")
                    ),
                ],
                separator="; ",
                ignore_nulls=True,
            )
        )
    )
    load_text = (
        pl.when(pl.col("sweep") == "closed")
        .then(pl.format("{} concurrent users (closed loop)", decimal_expr(pl.col("capacity_load"))))
        .otherwise(pl.format("{} req/s", decimal_expr(pl.col("capacity_load"))))
    )
    return (
        frame.with_columns(reason=reason)
        .with_columns(
            reason=pl.when(pl.col("reason") == "")
            .then(None)
            .when(has_capacity)
            .then(pl.concat_str([pl.col("reason"), at]))
            .otherwise(pl.col("reason"))
        )
        .with_columns(fitted=pl.col("reason").is_null())
        .with_columns(
            ttft_base_ms=pl.when("fitted").then(pl.lit(0.0)),
            ttft_per_prompt_token_ms=pl.when("fitted").then(ttft / inp),
            tpot_ms=pl.when("fitted").then(pl.coalesce(tpot, itl)),
            tpot_from=pl.when("fitted").then(
                pl.when(tpot.is_not_null())
                .then(pl.lit("tpot_p50_ms"))
                .otherwise(pl.lit("itl_mean_ms (no TPOT; mean per-gap ITL)"))
            ),
            source=pl.when("fitted").then(
                pl.format("benchmark:{} at {}", pl.col("candidate"), load_text)
            ),
        )
        .select(*keys, *(pl.col(c).cast(t) for c, t in FIT_SCHEMA.items()))
        .sort(["candidate", "sweep"], nulls_last=True)
    )


def fitted_model(row: dict[str, Any]) -> LatencyModel | None:
    """The :class:`LatencyModel` of one :func:`fit_latency_models` row (None when not fitted)."""
    if not row.get("fitted"):
        return None
    return LatencyModel(
        ttft_base_ms=float(row["ttft_base_ms"]),
        ttft_per_prompt_token_ms=float(row["ttft_per_prompt_token_ms"]),
        tpot_ms=float(row["tpot_ms"]),
        source=str(row["source"]),
    )


def _trace_means(requests: pl.LazyFrame) -> tuple[float | None, float | None]:
    row = requests.select(
        pl.col("prompt_tokens").cast(pl.Float64).mean().alias("prompt"),
        pl.col("output_tokens").cast(pl.Float64).mean().alias("output"),
    ).collect()
    prompt, output = row.item(0, "prompt"), row.item(0, "output")
    return (
        None if prompt is None else float(prompt),
        None if output is None else float(output),
    )


def _extrapolation_note(
    trace_mean: float | None, bench_mean: float | None, what: str, effect: str
) -> str | None:
    if trace_mean is None or bench_mean is None or bench_mean <= 0 or trace_mean <= 0:
        return None
    ratio = trace_mean / bench_mean
    if 1 / EXTRAPOLATION_FACTOR <= ratio <= EXTRAPOLATION_FACTOR:
        return None
    return (
        f"trace mean {what} {trace_mean:,.0f} tokens is {ratio:.3g}x the benchmark's "
        f"{bench_mean:,.0f}: {effect}"
    )


def estimate_concurrency(
    requests: pl.LazyFrame | pl.DataFrame,
    fits: pl.DataFrame,
    config_model: LatencyModel,
    *,
    max_points: int = 10,
    sweep: Callable[[LatencyModel], ConcurrencyResult] | None = None,
) -> pl.DataFrame:
    """The trace's peak and mean concurrency under the config model and each fitted model.

    The first row is the config model (``model`` = ``config``); then one row per ``fits`` row:
    ``benchmark`` rows with a model carry its parameters, ``source``, the figures and
    ``peak_vs_config``; rows without a model carry the fit's ``reason`` and no figures.
    ``estimated`` is the sweep's own flag: True whenever any request's duration came from the
    model (always, for traces without ``e2e_ms``). ``note`` says how far the trace's lengths lie
    outside the benchmark's. Columns: :data:`CONCURRENCY_SCHEMA`. ``sweep``: the concurrency
    under a model (default: the whole table's sweep at ``max_points``; a quarter of days is
    swept day by day, :class:`pipeline.shape.stage.ModelSweeps`).
    """
    lf = requests.lazy() if isinstance(requests, pl.DataFrame) else requests
    if sweep is None:
        sweep = partial(peak_concurrency, lf, max_points=max_points)
    prompt_mean, output_mean = _trace_means(lf)
    base = sweep(config_model)
    rows: list[dict[str, Any]] = [_row("config", CONFIG_LABEL, None, config_model, base, None)]
    for fit in fits.to_dicts():
        model = fitted_model(fit)
        if model is None:
            rows.append(
                {
                    "model": "benchmark",
                    "candidate": fit["candidate"],
                    "sweep": fit["sweep"],
                    "point_id": fit["point_id"],
                    "reason": fit["reason"],
                }
            )
            continue
        result = sweep(model)
        notes = [
            _extrapolation_note(
                prompt_mean,
                fit["input_tokens_mean"],
                "prompt",
                "TTFT extrapolated linearly from a zero base",
            ),
            _extrapolation_note(
                output_mean,
                fit["output_tokens_mean"],
                "output",
                "TPOT assumed constant over lengths not measured",
            ),
        ]
        if not result.estimated:
            notes.append("every duration is logged (e2e_ms): the model is not used")
        row = _row("benchmark", fit["candidate"], fit, model, result, base.peak)
        row["note"] = "; ".join(n for n in notes if n) or None
        rows.append(row)
    return pl.DataFrame(rows, schema=CONCURRENCY_SCHEMA)


def _row(
    kind: str,
    candidate: str,
    fit: dict[str, Any] | None,
    model: LatencyModel,
    result: ConcurrencyResult,
    config_peak: int | None,
) -> dict[str, Any]:
    return {
        "model": kind,
        "candidate": candidate,
        "sweep": None if fit is None else fit["sweep"],
        "source": model.source,
        "ttft_base_ms": model.ttft_base_ms,
        "ttft_per_prompt_token_ms": model.ttft_per_prompt_token_ms,
        "tpot_ms": model.tpot_ms,
        "tpot_from": None if fit is None else fit["tpot_from"],
        "point_id": None if fit is None else fit["point_id"],
        "peak_concurrency": result.peak,
        "peak_at": result.peak_at,
        "mean_concurrency": result.mean,
        "estimated": result.estimated,
        "durations_estimated": result.durations_estimated,
        "peak_vs_config": result.peak / config_peak if config_peak else None,
        "label": result.label,
        "reason": None,
        "note": None,
    }


def concurrency_payload(
    fits: pl.DataFrame, table: pl.DataFrame, notes: list[str] | None = None
) -> dict[str, Any]:
    """The JSON document of the ``concurrency_by_engine`` output (ISO timestamps)."""
    rows = table.with_columns(
        pl.col("peak_at").dt.to_string("%Y-%m-%dT%H:%M:%S%.6fZ").alias("peak_at")
    ).to_dicts()
    fit_rows = fits.with_columns(
        pl.col(c).cast(pl.String) for c, t in fits.schema.items() if t.is_temporal()
    ).to_dicts()
    return {
        "method": METHOD,
        "fits": fit_rows,
        "concurrency": rows,
        "notes": list(notes or []),
    }


def summary_markdown(table: pl.DataFrame) -> str:
    """A markdown table: one line per model with its parameters, source and figures."""
    if table.is_empty():
        return "_no concurrency computed_"
    return markdown_table(
        table.with_columns(reason_or_note=pl.coalesce("reason", "note")),
        [
            "candidate",
            "ttft_base_ms",
            "ttft_per_prompt_token_ms",
            "tpot_ms",
            "source",
            "peak_concurrency",
            "mean_concurrency",
            "estimated",
            "peak_vs_config",
            "reason_or_note",
        ],
        headers={
            "ttft_base_ms": "TTFT base ms",
            "ttft_per_prompt_token_ms": "TTFT ms/prompt token",
            "tpot_ms": "TPOT ms",
            "peak_concurrency": "peak",
            "mean_concurrency": "mean",
            "peak_vs_config": "peak / config",
            "reason_or_note": "reason or note",
        },
        digits=4,
    )
