"""Cost per million tokens at the SLO, and the fleet (GPUs, $/month) to serve a workload's rates.

Formulas (docs/decision-rules.md#cost-formula)::

    cost per 1M output tokens = gpu_count × $/GPU-hour ÷ (output tokens/s × 3600) × 10^6
    cost per 1M total tokens  = gpu_count × $/GPU-hour ÷ (total tokens/s × 3600) × 10^6
    replicas    = ceil(rate_rps ÷ capacity_rps)
    gpus        = replicas × gpu_count
    monthly_usd = gpus × $/GPU-hour × 730

The output token rate is the one the capacity point *sustained*: its send rate (achieved, else
offered) × the mean output tokens of its completed requests, valid because the point kept up
(:mod:`pipeline.bench.keepup`). The tool's whole-run rate divides by a duration that includes the
drain tail and understates it; ``cost_workings`` reports it beside, with the difference.
Interpolated capacities carry the same tokens per request to the interpolated rate.

Prices, highest precedence first: ``--gpu-hour-usd`` > the configured price for the GPU type >
the manifest's ``price_per_gpu_hour_usd`` > the configured default; ``price_source`` names which;
with none, the cost is null (``no price``).

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
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from pipeline.errors import ConfigError

HOURS_PER_MONTH = 730.0
COST_FORMULA = "cost per 1M tokens = gpu_count × $/GPU-hour ÷ (tokens/s × 3600) × 10^6"
FLEET_FORMULA = (
    "replicas = ceil(rate_rps ÷ capacity_rps); gpus = replicas × gpu_count; "
    "monthly_usd = gpus × $/GPU-hour × 730 h"
)


@dataclass(frozen=True)
class Prices:
    """$ per GPU-hour by GPU type, a default, and an override that beats everything."""

    gpu_hour_usd: Mapping[str, float] = field(default_factory=dict)
    default: float | None = None
    override: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpu_hour_usd": dict(sorted(self.gpu_hour_usd.items())),
            "default": self.default,
            "override": self.override,
        }


def parse_price(value: Any, where: str) -> float:
    """A $ per GPU-hour price: a finite number ≥ 0 (``where`` names the key or flag)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: must be a price in $ per GPU-hour, got {value!r}")
    price = float(value)
    if not math.isfinite(price) or price < 0:
        raise ConfigError(f"{where}: must be a finite price ≥ 0, got {value!r}")
    return price + 0.0  # -0.0 → 0.0


def prices_from_mapping(raw: Any, *, where: str = "bench.prices") -> Prices:
    """``{gpu_hour_usd: {H100: 3.0, L40S: 1.2, default: 3.0}}`` or ``{gpu_hour_usd: 3.0}``."""
    if raw is None:
        return Prices()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a mapping with key gpu_hour_usd")
    unknown = sorted(str(k) for k in raw if k != "gpu_hour_usd")
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; expected gpu_hour_usd")
    table = raw.get("gpu_hour_usd")
    if table is None:
        return Prices()
    if not isinstance(table, Mapping):
        return Prices(default=parse_price(table, f"{where}.gpu_hour_usd"))
    by_type: dict[str, float] = {}
    default: float | None = None
    for key, value in table.items():
        name = str(key).strip()
        if not name:
            raise ConfigError(f"{where}.gpu_hour_usd: empty GPU type name")
        price = parse_price(value, f"{where}.gpu_hour_usd.{name}")
        if name.lower() == "default":
            default = price
        else:
            by_type[name] = price
    return Prices(gpu_hour_usd=by_type, default=default)


def describe_prices(prices: Prices) -> str:
    """Where this run's $ per GPU-hour come from, highest precedence first, for the first lines
    of the output (the configuration file is named on the command's first line)."""
    if prices.override is not None:
        return (
            f"--gpu-hour-usd {prices.override:g} for every GPU type (over the configuration and "
            "the manifests)"
        )
    parts = []
    if prices.gpu_hour_usd:
        table = ", ".join(
            f"{name} {price:g}" for name, price in sorted(prices.gpu_hour_usd.items())
        )
        parts.append(f"the configuration's bench.prices by GPU type ({table})")
    parts.append("the manifests' price_per_gpu_hour_usd")
    if prices.default is not None:
        parts.append(f"the configuration's default {prices.default:g}")
    text = ", then ".join(parts)
    if len(parts) == 1:
        text += " only (no bench.prices configured); without one the cost is unknown"
    return text


def _norm(text: str) -> str:
    return re.sub(r"[^0-9A-Z]", "", text.upper())


def match_gpu_price(gpu_type: str | None, prices: Prices) -> tuple[float, str] | None:
    """The configured price for one GPU type: exact (case/punctuation-blind) match, else the
    longest configured name contained in it (``H100`` matches ``NVIDIA-H100-80GB``)."""
    if gpu_type is None:
        return None
    norm = _norm(gpu_type)
    exact = [k for k in prices.gpu_hour_usd if _norm(k) == norm]
    if exact:
        return prices.gpu_hour_usd[exact[0]], f"config gpu_hour_usd.{exact[0]}"
    contained = sorted(
        (k for k in prices.gpu_hour_usd if _norm(k) and _norm(k) in norm),
        key=lambda k: (-len(_norm(k)), k),
    )
    if contained:
        return prices.gpu_hour_usd[contained[0]], f"config gpu_hour_usd.{contained[0]}"
    return None


def attach_prices(frame: pl.DataFrame, prices: Prices) -> pl.DataFrame:
    """Add ``gpu_hour_usd`` and ``price_source`` to a frame with ``gpu_type`` (and optionally
    the manifest's ``price_per_gpu_hour_usd``).

    Precedence: override (``--gpu-hour-usd``) > configured price for the GPU type > manifest
    price > configured default; null (``no price``) when none applies.
    """
    gpu_types = (
        frame.get_column("gpu_type").unique().drop_nulls().sort().to_list()
        if "gpu_type" in frame.columns
        else []
    )
    matched = {g: match_gpu_price(g, prices) for g in gpu_types}
    price_map = {g: m[0] for g, m in matched.items() if m is not None}
    source_map = {g: m[1] for g, m in matched.items() if m is not None}
    gpu = pl.col("gpu_type") if "gpu_type" in frame.columns else pl.lit(None, dtype=pl.String)
    configured = gpu.replace_strict(price_map, default=None, return_dtype=pl.Float64)
    configured_src = gpu.replace_strict(source_map, default=None, return_dtype=pl.String)
    manifest = (
        pl.col("price_per_gpu_hour_usd").cast(pl.Float64)
        if "price_per_gpu_hour_usd" in frame.columns
        else pl.lit(None, dtype=pl.Float64)
    )
    override = pl.lit(prices.override, dtype=pl.Float64)
    default = pl.lit(prices.default, dtype=pl.Float64)
    return frame.with_columns(
        gpu_hour_usd=pl.coalesce(override, configured, manifest, default),
        price_source=pl.when(override.is_not_null())
        .then(pl.lit("--gpu-hour-usd"))
        .when(configured.is_not_null())
        .then(configured_src)
        .when(manifest.is_not_null())
        .then(pl.lit("manifest price_per_gpu_hour_usd"))
        .when(default.is_not_null())
        .then(pl.lit("config gpu_hour_usd.default"))
        .otherwise(pl.lit("no price")),
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

    def per_million(tps: str) -> pl.Expr:
        rate = pl.col(tps)
        return pl.when(rate > 0).then(hourly / (rate * 3600.0) * 1e6).otherwise(None)

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
        cost_per_1m_output_usd=per_million("output_throughput_tps"),
        cost_per_1m_total_usd=per_million("total_throughput_tps"),
        whole_run_cost_per_1m_output_usd=per_million("whole_run_output_tps"),
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
        "{} GPU × ${}/h ÷ ({} output tok/s × 3600) × 10^6 = ${} per 1M output tokens",
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
    ratio = pl.col("rate_rps") / pl.col("capacity_rps")
    # A hair below an integer is that integer (92.19 / 92.19 must be 1 replica, not 2).
    replicas = pl.when(pl.col("capacity_rps") > 0).then((ratio - 1e-9).ceil().clip(lower_bound=0))
    out = (
        base.join(rate_frame, how="cross")
        .with_columns(replicas=replicas.cast(pl.Int64))
        .with_columns(gpus=pl.col("replicas") * pl.col("gpu_count").cast(pl.Int64))
        .with_columns(monthly_usd=pl.col("gpus") * pl.col("gpu_hour_usd") * HOURS_PER_MONTH)
        .with_columns(
            fleet_workings=pl.when(pl.col("monthly_usd").is_not_null())
            .then(
                pl.format(
                    "ceil({} ÷ {}) = {} replicas × {} GPU = {} GPUs × ${}/h × 730 h = ${}/month",
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
