"""Every workload-shape metric of a canonical request table, assembled into one result.

The metrics themselves live in their own modules (arrivals, lengths, concurrency, mix,
findings); this one runs them over the frame it is given, adds the data the figures draw, and
notes where timestamp quantisation affects the concurrency estimate.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from pipeline.shape.arrivals import (
    ArrivalCounts,
    arrival_basics,
    arrival_metrics,
    arrival_series,
    observed_span,
    plot_bucket_s,
)
from pipeline.shape.chunked import (
    length_distributions,
    session_metrics_chunked,
    sketch_note,
    timestamp_figures_chunked,
)
from pipeline.shape.common import (
    PERCENTILE_METHOD_DOC,
    SKETCHED_PERCENTILE_METHOD_DOC,
    US_PER_S,
    as_lazy,
    json_safe,
    row_chunks,
    sketched,
)
from pipeline.shape.concurrency import peak_concurrency, peak_concurrency_chunked
from pipeline.shape.config import (
    CHUNK_ROWS,
    EXACT_MAX_REQUESTS,
    MIN_QUANTA_PER_WINDOW,
    PLOT_POINTS,
    ShapeConfig,
)
from pipeline.shape.daily import DailyFigures, DailyParts, merged_figures, plot_cdfs
from pipeline.shape.findings import place_on_axes
from pipeline.shape.lengths import cdf_points, length_metrics
from pipeline.shape.mix import (
    MAX_MODELS_LISTED,
    category_metrics,
    feature_metrics,
    provider_cache_metrics,
    session_metrics,
)
from pipeline.shape.result import ShapeMetrics, ShapePlotData, ShapeResult

SCHEMA_VERSION = 2


def quantisation_effect(arrivals: dict[str, Any], estimated: bool) -> dict[str, Any]:
    """Whether bucketed timestamps affect the concurrency figure, and how.

    Requests that share a timestamp bucket start together in the sweep, so the peak can be
    overstated by up to the requests of one bucket (and the mean is unaffected). An exact sweep
    over logged durations is affected the same way, since its starts are the bucketed arrivals.
    """
    quant = arrivals["quantisation"]
    if not quant["quantised"]:
        return {"affected": False, "quantum_s": None, "note": None}
    return {
        "affected": True,
        "quantum_s": quant["quantum_s"],
        "note": (
            f"arrivals are bucketed to ~{quant['quantum_s']:g} s, so requests of one bucket start "
            "together in the sweep: the peak"
            + (" (already estimated)" if estimated else "")
            + " may be overstated by up to one bucket's arrivals"
        ),
    }


def exact_limit() -> int:
    """The most requests measured as one table (``config.EXACT_MAX_REQUESTS``; read when
    called, so a test may lower it for a small trace)."""
    return EXACT_MAX_REQUESTS


def compute_shape(
    requests: pl.LazyFrame | pl.DataFrame,
    cfg: ShapeConfig,
    *,
    exact_max_requests: int | None = None,
    chunk_rows: int = CHUNK_ROWS,
    days: DailyParts | None = None,
) -> ShapeResult:
    """Every workload-shape metric of a canonical request table (keys: docs/shape.md).

    Up to ``exact_max_requests`` rows (default ``config.EXACT_MAX_REQUESTS``) every figure
    comes from the whole table. Above, a workload ingested as days (``days``: the table's UTC
    days, and where their parts are kept) is measured from per-day parts
    (:mod:`pipeline.shape.daily`), and any other table (sorted by arrival, as ingest writes
    it) in chunks of ``chunk_rows`` rows (:mod:`pipeline.shape.chunked`); either way some
    percentiles are sketched, which the result records under ``percentiles_sketched``.
    """
    frame = as_lazy(requests)
    if exact_max_requests is None:
        exact_max_requests = exact_limit()
    metrics: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
    chunked = sketched(frame, exact_max_requests)
    daily = None
    if chunked and days is not None:
        daily = merged_figures(days.sources, cfg.latency, days.store, PLOT_POINTS)
    if daily is not None:
        metrics["percentile_method"] = SKETCHED_PERCENTILE_METHOD_DOC
        arrivals, conc = daily.arrivals, daily.concurrency
        lengths, sessions = daily.lengths, daily.sessions
    elif not chunked:
        metrics["percentile_method"] = PERCENTILE_METHOD_DOC
        arrivals = arrival_metrics(frame, MIN_QUANTA_PER_WINDOW)
        conc = peak_concurrency(frame, cfg.latency, PLOT_POINTS)
        lengths = length_metrics(frame)
        sessions = session_metrics(frame)
    else:
        arrival_basics(frame)  # an empty table or null arrivals is named before the chunks
        chunks = row_chunks(frame, chunk_rows)
        metrics["percentile_method"] = SKETCHED_PERCENTILE_METHOD_DOC
        timestamps = timestamp_figures_chunked(chunks)
        arrivals = arrival_metrics(frame, MIN_QUANTA_PER_WINDOW, timestamps)
        conc = peak_concurrency_chunked(chunks, cfg.latency, PLOT_POINTS)
        lengths = length_metrics(frame, length_distributions(chunks))
        sessions = session_metrics_chunked(chunks, chunk_rows)
    metrics.update(
        {
            "requests": arrivals["requests"],
            "arrivals": arrivals,
            "lengths": lengths,
            "concurrency": {
                **conc.as_dict(),
                "quantisation": quantisation_effect(arrivals, conc.estimated),
            },
            "sessions": sessions,
            **(
                daily.mix
                if daily is not None
                else {
                    "tenants": category_metrics(frame, "tenant"),
                    "models": category_metrics(frame, "model", top=MAX_MODELS_LISTED),
                    "features": feature_metrics(frame),
                    "provider_cache": provider_cache_metrics(frame),
                }
            ),
            "config": cfg.recorded(),
        }
    )
    if chunked:
        merged = "days" if daily is not None else "chunks"
        metrics["percentiles_sketched"] = sketch_note(
            arrivals["requests"], exact_max_requests, merged
        )
    metrics["findings"] = [f.as_dict() for f in place_on_axes(metrics, cfg)]
    return ShapeResult(
        metrics=ShapeMetrics.model_validate(json_safe(metrics)),
        concurrency_series=conc.series,
        plots=plot_data(frame, metrics, PLOT_POINTS, daily),
    )


def plot_data(
    frame: pl.LazyFrame,
    metrics: dict[str, Any],
    plot_points: int,
    daily: DailyFigures | None = None,
) -> ShapePlotData:
    """The length CDFs and the arrival series at a bucket the timestamps support (from the
    days' merged counts when measured from days, but a bucket of a fraction of a second)."""
    arrivals = metrics["arrivals"]
    supported = [w["window_s"] for w in arrivals["windows"].values() if w["supported"]]
    quantum = arrivals["quantisation"]["quantum_s"]
    finest = min(supported) if supported else max(float(quantum or 1.0) * 3, 60.0)
    bucket = plot_bucket_s(arrivals["span_s"], finest, plot_points)
    span = observed_span(arrivals["first"], arrivals["last"], quantum)
    counts: pl.LazyFrame | ArrivalCounts = frame
    if daily is not None and round(bucket * US_PER_S) % US_PER_S == 0:
        counts = daily.seconds
    return ShapePlotData(
        length_cdfs=plot_cdfs(daily, plot_points)
        if daily is not None
        else {
            name: cdf_points(frame, column, plot_points)
            for name, column in (("prompt", "prompt_tokens"), ("output", "output_tokens"))
        },
        arrival_series=arrival_series(counts, bucket, span),
        arrival_bucket_s=bucket,
    )
