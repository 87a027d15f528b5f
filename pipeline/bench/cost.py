"""Cost per million tokens at the SLO, and the fleet (GPUs, $/month) to serve a workload's rates,
for the benchmark's capacity table. The formulas, prices and their precedence are
:mod:`pipeline.costing`'s (docs/decision-rules.md#cost-formula).

The output token rate is the one the capacity point *sustained*: its send rate (achieved, else
offered) × the mean output tokens of its completed requests, valid because the point kept up
(:mod:`pipeline.bench.keepup`). The tool's whole-run rate divides by a duration that includes the
drain tail and understates it; ``cost_workings`` reports it beside, with the difference.
Interpolated capacities carry the same tokens per request to the interpolated rate.

Noise: where the capacity load was run more than once (``repeats`` ≥ 2), ``cost_spread`` is the
relative range (max − min) ÷ mean of the cost of each repeat and ``cost_cv`` its coefficient of
variation. :func:`cost_gap_vs_noise` compares each ranked candidate's cost gap to the cheapest of
its pool with the larger ``cost_spread`` of the two (the noise of a re-run); with no repeats on
either side the noise is unknown and said so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import polars as pl

from pipeline.costing import (
    HOURS_PER_MONTH,
    SECONDS_PER_HOUR,
    Prices,
    monthly_usd,
    per_million,
    replicas_for,
)


def attach_prices(frame: pl.DataFrame, prices: Prices) -> pl.DataFrame:
    """Add ``gpu_hour_usd`` and ``price_source`` to a frame with ``gpu_type`` (and optionally
    the manifest's ``price_per_gpu_hour_usd``): :meth:`Prices.price_for` of each row."""
    gpus = frame.get_column("gpu_type") if "gpu_type" in frame.columns else None
    manifest = (
        frame.get_column("price_per_gpu_hour_usd").cast(pl.Float64)
        if "price_per_gpu_hour_usd" in frame.columns
        else None
    )
    priced = [
        prices.price_for(
            gpus[i] if gpus is not None else None, manifest[i] if manifest is not None else None
        )
        for i in range(frame.height)
    ]
    return frame.with_columns(
        gpu_hour_usd=pl.Series([p for p, _ in priced], dtype=pl.Float64),
        price_source=pl.Series([s for _, s in priced], dtype=pl.String),
    )


def _money(expr: pl.Expr, digits: int = 4) -> pl.Expr:
    return expr.round(digits).cast(pl.String)


def cost_per_million(capacity: pl.DataFrame, prices: Prices) -> pl.DataFrame:
    """The capacity table with prices and ``cost_per_1m_output_usd`` / ``cost_per_1m_total_usd``.

    Needs ``gpu_type``, ``gpu_count``, ``output_throughput_tps`` and ``total_throughput_tps``
    (as :func:`pipeline.bench.slo.slo_capacity` writes them). ``cost_workings`` spells the
    output-token formula out with the numbers used.
    """
    priced = attach_prices(capacity, prices)
    gpus = pl.col("gpu_count").cast(pl.Float64)
    hourly = gpus * pl.col("gpu_hour_usd")

    def at_rate(tps: str) -> pl.Expr:
        rate = pl.col(tps)
        return pl.when(rate > 0).then(per_million(hourly, rate * SECONDS_PER_HOUR)).otherwise(None)

    priced = priced.with_columns(
        (pl.lit(None, dtype=dtype).alias(name))
        for name, dtype in _RATE_DETAIL.items()
        if name not in priced.columns
    )
    repeat_costs = pl.col("repeat_output_tps").list.eval(
        pl.when(pl.element() > 0).then(1.0 / pl.element())
    )
    spread = pl.col("repeats").fill_null(0) >= 2
    whole = pl.col("whole_run_output_tps")
    return priced.with_columns(
        deployment_usd_per_hour=hourly,
        cost_per_1m_output_usd=at_rate("output_throughput_tps"),
        cost_per_1m_total_usd=at_rate("total_throughput_tps"),
        whole_run_cost_per_1m_output_usd=at_rate("whole_run_output_tps"),
        whole_run_vs_sustained=pl.when(pl.col("output_throughput_tps") > 0).then(
            whole / pl.col("output_throughput_tps") - 1.0
        ),
        # cost ∝ 1 / output rate for one candidate, so the price cancels out of the ratios
        cost_spread=pl.when(spread).then(
            (repeat_costs.list.max() - repeat_costs.list.min()) / repeat_costs.list.mean()
        ),
        cost_cv=pl.when(spread).then(repeat_costs.list.std(ddof=1) / repeat_costs.list.mean()),
    ).with_columns(cost_workings=_cost_workings())


_RATE_DETAIL: dict[str, pl.DataType] = {
    "sustained_rate_rps": pl.Float64(),
    "output_tokens_mean": pl.Float64(),
    "whole_run_output_tps": pl.Float64(),
    "output_rate_basis": pl.String(),
    "interpolated": pl.Boolean(),
    "capacity_rps": pl.Float64(),
    "repeats": pl.UInt32(),
    "repeat_output_tps": pl.List(pl.Float64()),
}


def _cost_workings() -> pl.Expr:
    """The output-token formula with its numbers, where the rate came from, and the whole-run
    rate beside it with the difference."""
    rate = pl.col("output_throughput_tps")
    formula = pl.format(
        f"{{}} GPU × ${{}}/h ÷ ({{}} output tok/s × {SECONDS_PER_HOUR:g}) × 10^6 = ${{}} per 1M "
        "output tokens",
        pl.col("gpu_count"),
        _money(pl.col("gpu_hour_usd"), 4),
        rate.round(1),
        _money(pl.col("cost_per_1m_output_usd"), 4),
    )
    interpolated = pl.col("interpolated").fill_null(False)
    source = (
        pl.when(pl.col("output_rate_basis").str.starts_with("sustained") & ~interpolated)
        .then(
            pl.format(
                "output rate sustained = {} req/s sent × {} mean output tokens",
                pl.col("sustained_rate_rps").round(3),
                pl.col("output_tokens_mean").round(2),
            )
        )
        .when(pl.col("output_rate_basis").str.starts_with("sustained"))
        .then(
            pl.format(
                "output rate = interpolated {} req/s × {} mean output tokens",
                pl.col("capacity_rps").round(3),
                pl.col("output_tokens_mean").round(2),
            )
        )
        .when(pl.col("output_rate_basis").is_not_null())
        .then(pl.format("output rate {}", pl.col("output_rate_basis")))
    )
    whole = pl.when(
        pl.col("output_rate_basis").str.starts_with("sustained")
        & pl.col("whole_run_output_tps").is_not_null()
    ).then(
        pl.format(
            "the tool's whole-run rate {} tok/s differs by {}% (drain tail) and would give ${}",
            pl.col("whole_run_output_tps").round(1),
            _pct(pl.col("whole_run_vs_sustained")),
            _money(pl.col("whole_run_cost_per_1m_output_usd"), 4),
        )
    )
    return pl.when(pl.col("cost_per_1m_output_usd").is_not_null()).then(
        pl.concat_str([formula, source, whole], separator="; ", ignore_nulls=True)
    )


def cost_gap_vs_noise(costed: pl.DataFrame, pool: str = "rank_pool") -> pl.DataFrame:
    """Add ``cost_gap_share``, ``noise_share``, ``gap_exceeds_noise`` and ``noise_note`` to the
    ranked rows (``cost_rank`` not null) of :func:`cost_per_million`'s output.

    The gap is cost ÷ the cheapest of the same ``pool`` − 1; the noise is the larger
    ``cost_spread`` of the candidate and that cheapest one (null when neither was repeated).
    """
    ranked = pl.col("cost_rank").is_not_null()
    cheapest = pl.col("cost_per_1m_output_usd").filter(ranked).min().over(pool)
    cheapest_spread = (
        pl.col("cost_spread")
        .filter(ranked & (pl.col("cost_per_1m_output_usd") == cheapest))
        .max()
        .over(pool)
    )
    frame = costed.with_columns(
        cost_gap_share=pl.when(ranked).then(pl.col("cost_per_1m_output_usd") / cheapest - 1.0),
        noise_share=pl.when(ranked).then(pl.max_horizontal("cost_spread", cheapest_spread)),
    )
    gap, noise = pl.col("cost_gap_share"), pl.col("noise_share")
    repeats = pl.format("{} repeats", pl.col("repeats").fill_null(1))
    return frame.with_columns(
        gap_exceeds_noise=pl.when(ranked & noise.is_not_null() & (gap > 0)).then(gap > noise),
        noise_note=pl.when(~ranked)
        .then(None)
        .when(gap == 0)
        .then(
            pl.when(noise.is_null())
            .then(pl.lit("cheapest of its pool; no repeats: noise unknown"))
            .otherwise(pl.format("cheapest of its pool; noise {}% ({})", _pct(noise), repeats))
        )
        .when(noise.is_null())
        .then(pl.format("{}% above the cheapest; no repeats: noise unknown", _pct(gap)))
        .otherwise(
            pl.format(
                "{}% above the cheapest {} the noise {}% (larger relative cost range over "
                "repeated runs at the capacity load of the two candidates)",
                _pct(gap),
                pl.when(gap > noise).then(pl.lit(">")).otherwise(pl.lit("≤")),
                _pct(noise),
            )
        ),
    )


def _pct(expr: pl.Expr) -> pl.Expr:
    return (expr * 100).round(1).cast(pl.String)


def workload_rates(
    mean_rate_rps: float | None,
    peak_rate_rps: Mapping[str, float],
    peak_window: str,
) -> dict[str, float]:
    """The rates a fleet must serve: ``mean`` and ``peak_<window>`` (the configured window, or
    the longest window the shape stage measured when that one is absent)."""
    rates: dict[str, float] = {}
    if mean_rate_rps is not None and math.isfinite(mean_rate_rps):
        rates["mean"] = float(mean_rate_rps)
    if peak_rate_rps:
        window = peak_window if peak_window in peak_rate_rps else _longest_window(peak_rate_rps)
        rates[f"peak_{window}"] = float(peak_rate_rps[window])
    return rates


def _window_seconds(label: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?", label.strip())
    if not match:
        return -1.0
    scale = {"ms": 0.001, "s": 1.0, None: 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
    return float(match.group(1)) * scale[match.group(2)]


def _longest_window(peaks: Mapping[str, float]) -> str:
    return max(sorted(peaks), key=_window_seconds)


FLEET_SCHEMA: dict[str, pl.DataType] = {
    "rate_label": pl.String(),
    "rate_rps": pl.Float64(),
    "capacity_rps": pl.Float64(),
    "replicas": pl.Int64(),
    "gpus": pl.Int64(),
    "gpu_hour_usd": pl.Float64(),
    "monthly_usd": pl.Float64(),
    "fleet_workings": pl.String(),
}


def fleet_cost(costed: pl.DataFrame, rates: Mapping[str, float], keys: list[str]) -> pl.DataFrame:
    """GPUs and $/month to serve each rate with each candidate (one row per candidate × rate).

    ``costed`` is :func:`cost_per_million`'s output; rows without a capacity are kept with null
    replicas so the table shows every candidate. ``keys`` are the candidate columns to carry.
    """
    rate_frame = pl.DataFrame(
        {"rate_label": list(rates), "rate_rps": [float(v) for v in rates.values()]},
        schema={"rate_label": pl.String, "rate_rps": pl.Float64},
    )
    extra = [c for c in ("capacity_rps", "gpu_count", "gpu_hour_usd") if c not in keys]
    base = costed.filter(pl.col("sweep") != "other").select(*keys, "sweep", *extra)
    joined = base.join(rate_frame, how="cross")
    sized = [
        replicas_for(rate, capacity) if capacity is not None and capacity > 0 else None
        for rate, capacity in zip(joined["rate_rps"], joined["capacity_rps"], strict=True)
    ]
    out = (
        joined.with_columns(replicas=pl.Series(sized, dtype=pl.Int64))
        .with_columns(gpus=pl.col("replicas") * pl.col("gpu_count").cast(pl.Int64))
        .with_columns(monthly_usd=monthly_usd(pl.col("gpus"), pl.col("gpu_hour_usd")))
        .with_columns(
            fleet_workings=pl.when(pl.col("monthly_usd").is_not_null())
            .then(
                pl.format(
                    "ceil({} ÷ {}) = {} replicas × {} GPU = {} GPUs × ${}/h × "
                    f"{HOURS_PER_MONTH:g} h = ${{}}/month",
                    pl.col("rate_rps").round(3),
                    pl.col("capacity_rps").round(3),
                    pl.col("replicas"),
                    pl.col("gpu_count"),
                    pl.col("gpus"),
                    _money(pl.col("gpu_hour_usd"), 4),
                    _money(pl.col("monthly_usd"), 2),
                )
            )
            .when(pl.col("replicas").is_null())
            .then(pl.lit("no capacity at the SLO: cannot size a fleet"))
            .otherwise(pl.lit("no $/GPU-hour price for this GPU type"))
        )
    )
    return out.select(
        *keys,
        "sweep",
        *(pl.col(c).cast(t) for c, t in FLEET_SCHEMA.items() if c not in keys),
    ).sort([*keys, "sweep", "rate_label"], nulls_last=True)
