"""Service-level objective: which load points pass, and the highest load that still passes.

An SLO is a set of latency limits (``ttft_p95_ms <= 1000``, ``itl_p99_ms <= 60`` ...), a named
inter-token-latency definition, and optional error-rate and offered-rate checks. Each load point
(one row of the normalised load-point table, :mod:`pipeline.bench.schema`) gets a status:

``pass``     every limit is known and met, and an open-loop server kept up;
``fail``     at least one known value breaks a limit (a missing value cannot rescue it), or the
             open-loop server was **overloaded**: it fell behind the rate requests were sent at
             by more than ``bench.overload.tolerance`` (:mod:`pipeline.bench.keepup`: the
             estimators, the drain tail, and what the real samples measure), whatever its
             percentiles -- a short run of a growing queue shows percentiles a longer run would not;
``unknown``  nothing breaks a limit, but a needed value is missing, the client did not send at
             the offered rate, the data cannot show whether the server kept up, a percentile
             has too few completed requests behind it, or the record holds a value no run can
             produce (``rejected_values``: a negative or infinite latency, rate or count)
             -- never a silent pass.

Enough requests for a percentile: percentile q needs ``n ≥ ⌈k ÷ (1 − q)⌉`` completed requests
(k = ``bench.min_tail_requests``, default 1: p50 needs 2, p90 10, p95 20, p99 100), so that about
k requests lie above it; a p99 of 20 requests is their maximum. The rule counts requests for
every metric, per-gap ITL included: its gaps are pooled from those requests and share their
batches, so they are not independent samples. k = 0 disables the rule.

The capacity search orders each candidate's points by load (offered rate for open-loop sweeps,
concurrency for closed-loop sweeps, which are kept apart) and takes the highest passing load below
the first failing one. Passes above a failure are reported as a non-monotone pattern, not used.
Capacity is never above the rate the capacity point actually sustained (its send rate), and the
token rates to cost are the sustained ones (send rate × mean tokens per request), not the tool's
whole-run figures, which the drain tail lowers. Interpolating between the last pass and the first
failure happens only when asked, only toward a failure that kept up, and is marked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import polars as pl

from pipeline.bench.config import BenchConfig, SloSpec, format_bound
from pipeline.bench.frames import column_or_null, float_column
from pipeline.bench.keepup import (
    KEPT_UP,
    OVERLOADED,
    UNKNOWN,
    judge_keep_up,
    mean_output_tokens_expr,
    send_rate_expr,
)
from pipeline.bench.schema import impossible_values, screen_measurements
from pipeline.present.text import decimal_expr

#: percentile name -> percent of requests at or below it
PERCENTILE_SHARES = {"p50": 50, "p90": 90, "p95": 95, "p99": 99}

#: The columns that identify one candidate deployment (one sweep), in output order.
CANDIDATE_KEYS = (
    "engine",
    "engine_version",
    "backend",
    "label",
    "model",
    "quantization",
    "gpu_type",
    "gpu_count",
    "workload",
)


# --------------------------------------------------------------------------------------------
# Per-point evaluation


def error_rate_expr(frame: pl.DataFrame) -> pl.Expr:
    """The reader's ``error_rate``, else failed / (completed + failed); null when unknown."""
    failed = float_column(frame, "failed")
    completed = float_column(frame, "completed")
    total = completed + failed
    derived = pl.when(total > 0).then(failed / total).otherwise(None)
    return pl.coalesce(float_column(frame, "error_rate"), derived)


def sweep_kind_expr(frame: pl.DataFrame) -> pl.Expr:
    """``open`` (finite offered rate), ``closed`` (a fixed number of users), or ``other``.

    ``other`` covers offline bursts (offered rate +inf), ramps, trace replays and points without
    a load figure: they are listed but not searched, having no single load to order them by.
    """
    mode = column_or_null(frame, "load_mode", pl.String())
    process = column_or_null(frame, "arrival_process", pl.String())
    rate = float_column(frame, "offered_rate_rps")
    users = float_column(frame, "concurrency")
    return (
        pl.when(mode.eq_missing("offline") | process.is_in(["ramp", "trace"]).fill_null(False))
        .then(pl.lit("other"))
        .when(mode.eq_missing("closed"))
        .then(pl.when(users.is_not_null()).then(pl.lit("closed")).otherwise(pl.lit("other")))
        .when(rate.is_not_null() & rate.is_finite())
        .then(pl.lit("open"))
        .otherwise(pl.lit("other"))
    )


def required_requests(stat: str, min_tail_requests: int) -> int:
    """Completed requests a statistic needs: ``⌈k ÷ (1 − q)⌉`` for percentile q (k requests
    expected above it), so at k = 1 p50 needs 2, p90 10, p95 20, p99 100; a mean needs 1."""
    if stat not in PERCENTILE_SHARES:
        return min(min_tail_requests, 1)
    above = 100 - PERCENTILE_SHARES[stat]  # percent of requests above the percentile
    return -(-100 * min_tail_requests // above)  # exact integer ceiling


def order_statistic_interval(
    n: int, q: float, confidence: float = 0.95
) -> tuple[int | None, int | None]:
    """The ranks (1 = smallest) of the distribution-free confidence interval for the q-th
    quantile from ``n`` samples: the true quantile lies between the sample's r-th and s-th
    smallest values with probability at least ``confidence`` (ranks from the binomial
    distribution of the number of samples below the quantile). None for a bound the sample
    cannot give: at n = 100 a p99's upper bound lies beyond the largest value (the sample
    maximum is all there is), so nothing bounds it from above."""
    alpha = (1 - confidence) / 2
    log_q, log_rest = math.log(q), math.log1p(-q)
    cdf, lower, upper = 0.0, None, None
    for k in range(n + 1):  # cdf = P(fewer than k + 1 samples below the quantile)
        cdf += math.exp(
            math.lgamma(n + 1)
            - math.lgamma(k + 1)
            - math.lgamma(n - k + 1)
            + k * log_q
            + (n - k) * log_rest
        )
        if cdf <= alpha and k + 1 <= n:
            lower = k + 1
        if upper is None and cdf >= 1 - alpha and k + 1 <= n:
            upper = k + 1
    return lower, upper


def evaluate_slo(
    points: pl.DataFrame,
    settings: BenchConfig,
    *,
    per_request: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """The load points with ``sweep``, ``load``, ``error_rate``, the keep-up verdict
    (:data:`pipeline.bench.keepup.KEEP_UP_SCHEMA`), ``slo_status`` and ``slo_reason``.

    ``load`` is the offered rate (req/s) for open-loop points and the concurrency for closed-loop
    points; null for ``other``. ``slo_reason`` names every broken or missing limit with its value.
    ``per_request`` (the reader's per-request table) lets the keep-up check use send times.
    """
    slo, min_tail_requests = settings.slo, settings.min_tail_requests
    points = screen_measurements(points)  # the readers screen too; frames built by hand may not
    kind = sweep_kind_expr(points)
    frame = judge_keep_up(points.with_columns(sweep=kind), per_request, settings.overload)
    violated: list[pl.Expr] = []
    missing: list[pl.Expr] = []
    keep_up = pl.col("keep_up_status")
    violated.append(keep_up == OVERLOADED)
    missing.append(keep_up == UNKNOWN)
    reasons: list[pl.Expr] = [
        pl.when(keep_up.is_in([OVERLOADED, UNKNOWN])).then(pl.col("keep_up_reason"))
    ]
    completed = float_column(frame, "completed")
    source = column_or_null(frame, "source_file", pl.String()).fill_null("the result file")
    for limit in slo.limits:
        column = limit.column(slo.itl_definition)
        value = float_column(frame, column)
        label = limit.label(slo.itl_definition)
        rejected = (
            pl.col("rejected_values")
            .list.eval(pl.element().filter(pl.element().str.starts_with(f"{column} = ")))
            .list.first()
        )
        needed = required_requests(limit.stat, min_tail_requests)
        too_few = (completed < needed) | completed.is_null()
        bad = (value > limit.max_ms) & ~too_few
        violated.append(bad.fill_null(False))
        missing.append(value.is_null() | too_few)
        limit_text = f"≤ {format_bound(limit.max_ms)} ms"
        # the measured value beside its limit, for a value that cannot be judged
        measured = pl.format(f" (measured {{}} ms, limit {limit_text})", value.round(1))
        reasons.append(
            pl.when(bad)
            .then(pl.format(f"{label} {{}} ms > {format_bound(limit.max_ms)} ms", value.round(1)))
            .when(rejected.is_not_null())
            .then(pl.format(f"{label} unknown: {{}} in {{}}", rejected, source))
            .when(value.is_null())
            .then(pl.lit(f"{label} missing (limit {limit_text})"))
            .when(completed.is_null())
            .then(
                pl.format(
                    f"completed requests not recorded; {label} needs ≥ {needed}{{}}", measured
                )
            )
            .when(too_few)
            .then(
                pl.format(
                    f"only {{}} completed requests; {label} needs ≥ {needed}{{}}",
                    completed.cast(pl.Int64),
                    measured,
                )
            )
        )
    # Any other impossible value (a negative throughput, rate or count) leaves the whole record
    # untrusted: it cannot pass either.
    limited = "|".join(re.escape(limit.column(slo.itl_definition)) for limit in slo.limits)
    impossible = impossible_values(frame)
    others = impossible.list.eval(
        pl.element().filter(~pl.element().str.contains(f"^({limited}) = "))
    )
    missing.append(impossible.list.len() > 0)
    reasons.append(
        pl.when(others.list.len() > 0).then(
            pl.format("not judged: impossible value(s) in {}: {}", source, others.list.join("; "))
        )
    )
    err = error_rate_expr(frame)
    if slo.max_error_rate is not None:
        bad = err > slo.max_error_rate
        violated.append(bad.fill_null(False))
        missing.append(err.is_null())
        reasons.append(
            pl.when(bad)
            .then(
                pl.format(
                    f"error rate {{}}% > {format_bound(slo.max_error_rate * 100)}%",
                    (err * 100).round(2),
                )
            )
            .when(err.is_null())
            .then(pl.lit("failure count not recorded"))
        )
    rate = float_column(frame, "offered_rate_rps")
    achieved = float_column(frame, "achieved_rate_rps")
    if slo.min_achieved_rate_share is not None:
        short = (
            rate.is_finite() & (rate > 0) & (achieved < rate * slo.min_achieved_rate_share)
        ).fill_null(False)
        missing.append(short)
        reasons.append(
            pl.when(short).then(
                pl.format(
                    "achieved send rate {} req/s < "
                    f"{format_bound(slo.min_achieved_rate_share * 100)}% of offered {{}} req/s",
                    achieved.round(2),
                    rate.round(2),
                )
            )
        )
    return frame.with_columns(
        load=pl.when(pl.col("sweep") == "open")
        .then(rate)
        .when(pl.col("sweep") == "closed")
        .then(float_column(frame, "concurrency")),
        error_rate=err,
        slo_status=pl.when(pl.any_horizontal(violated))
        .then(pl.lit("fail"))
        .when(pl.any_horizontal(missing))
        .then(pl.lit("unknown"))
        .otherwise(pl.lit("pass")),
        slo_reason=pl.concat_str(reasons, separator="; ", ignore_nulls=True),
    ).with_columns(
        slo_reason=pl.when(pl.col("slo_status") == "pass")
        .then(pl.lit("all limits met"))
        .otherwise(pl.col("slo_reason"))
    )


# --------------------------------------------------------------------------------------------
# Capacity search

CAPACITY_SCHEMA_EXTRA: dict[str, pl.DataType] = {
    "sweep": pl.String(),
    "n_points": pl.UInt32(),
    "n_pass": pl.UInt32(),
    "n_fail": pl.UInt32(),
    "n_unknown": pl.UInt32(),
    "min_load": pl.Float64(),
    "max_load": pl.Float64(),
    "pattern": pl.String(),
    "first_fail_load": pl.Float64(),
    "capacity_load": pl.Float64(),
    "capacity_status": pl.String(),
    "non_monotone": pl.Boolean(),
    "passes_above_fail": pl.String(),
    "unknown_above_capacity": pl.String(),
    "capacity_point_id": pl.String(),
    "interpolated": pl.Boolean(),
    "n_loads": pl.UInt32(),
    "capacity_rps": pl.Float64(),
    "sustained_rate_rps": pl.Float64(),
    "output_tokens_mean": pl.Float64(),
    "output_throughput_tps": pl.Float64(),
    "whole_run_output_tps": pl.Float64(),
    "output_rate_basis": pl.String(),
    "total_throughput_tps": pl.Float64(),
    "price_per_gpu_hour_usd": pl.Float64(),
    "repeats": pl.UInt32(),
    "repeat_output_tps": pl.List(pl.Float64()),
    "output_rate_spread": pl.Float64(),
    "output_rate_cv": pl.Float64(),
    "note": pl.String(),
}
SUSTAINED_BASIS = "sustained: send rate × mean output tokens"

_SYMBOL = {"pass": "P", "fail": "F", "unknown": "?"}


def candidate_keys(frame: pl.DataFrame) -> list[str]:
    """The candidate-identifying columns present in ``frame`` (see :data:`CANDIDATE_KEYS`)."""
    return [key for key in CANDIDATE_KEYS if key in frame.columns]


def slo_capacity(
    evaluated: pl.DataFrame,
    slo: SloSpec,
    *,
    interpolate: bool = False,
    keys: Sequence[str] | None = None,
) -> pl.DataFrame:
    """One row per candidate × sweep kind: the highest passing load below the first failure.

    ``evaluated`` is :func:`evaluate_slo`'s output. Columns (besides the candidate keys):

    - ``pattern``: every point in load order as ``load:P|F|?`` (P pass, F fail, ? unknown);
    - ``capacity_status``: ``bracketed`` (a pass below a failure), ``not_bracketed`` (no failure
      seen: capacity is at least the highest load tried), ``below_range`` (no pass before the first
      failure), ``unknown`` (no pass and no failure), ``not_searched`` (bursts, ramps, traces);
    - ``capacity_load``: the measured highest passing load below the first failure (req/s for
      ``open``, concurrency for ``closed``); ``capacity_point_id`` the point it came from;
    - ``non_monotone`` / ``passes_above_fail``: passes at loads above the first failure (reported,
      never used); ``unknown_above_capacity``: unknown points between capacity and failure;
    - ``interpolated``: True when ``interpolate`` was asked and the capacity (``capacity_rps`` and
      the throughputs) were linearly interpolated between the last pass and the first failure;
    - ``n_loads``: distinct loads tried (1: the capacity rests on a single load point);
    - ``capacity_rps``: requests/s the deployment serves within the SLO: for open loop the
      offered rate, but never above ``sustained_rate_rps`` (the rate requests were actually sent
      at the capacity point, which kept up: achieved send rate, else offered); for closed loop
      the *achieved* request throughput (flagged in ``note``);
    - ``output_throughput_tps`` / ``total_throughput_tps``: the token rates the capacity point
      sustained (open loop): ``sustained_rate_rps`` × ``output_tokens_mean`` (mean output tokens
      per completed request; × mean input + output for the total). The tool's whole-run rate
      (``whole_run_output_tps``) divides by a duration that includes the drain tail, so it
      understates the sustained rate; it is kept beside. ``output_rate_basis`` says which was
      used (the whole-run rate only when the mean output length is unknown, and for closed loop);
    - ``price_per_gpu_hour_usd``: the manifest price carried by the capacity point;
    - ``repeats``: passing points at the capacity load (repeated runs); ``repeat_output_tps`` their
      output token rates; ``output_rate_spread`` (max − min) ÷ mean and ``output_rate_cv`` (sample
      standard deviation ÷ mean) of those rates, null with fewer than two repeats. The capacity
      point is the repeat with the lowest output rate (the conservative one).
    """
    group = list(keys) if keys is not None else candidate_keys(evaluated)
    by = [*group, "sweep"]
    frame = evaluated.with_columns(
        **_token_rates(evaluated),
        request_throughput_rps=float_column(evaluated, "request_throughput_rps"),
        point_id=column_or_null(evaluated, "point_id", pl.String()),
        price_per_gpu_hour_usd=float_column(evaluated, "price_per_gpu_hour_usd"),
        keep_up_status=column_or_null(evaluated, "keep_up_status", pl.String()),
    ).sort([*by, "load", "point_id"], nulls_last=True)
    status = pl.col("slo_status")
    load = pl.col("load")
    first_fail = load.filter(status == "fail").min()
    summary = frame.group_by(by, maintain_order=True).agg(
        n_points=pl.len().cast(pl.UInt32),
        n_pass=(status == "pass").sum().cast(pl.UInt32),
        n_fail=(status == "fail").sum().cast(pl.UInt32),
        n_unknown=(status == "unknown").sum().cast(pl.UInt32),
        min_load=load.min(),
        max_load=load.max(),
        n_loads=load.drop_nulls().n_unique().cast(pl.UInt32),
        pattern=pl.concat_str(
            pl.coalesce(decimal_expr(load), pl.lit("-")),
            pl.lit(":"),
            status.replace_strict(_SYMBOL, return_dtype=pl.String),
        ).str.join(" "),
        first_fail_load=first_fail,
        capacity_load=load.filter(
            (status == "pass") & (first_fail.is_null() | (load < first_fail))
        ).max(),
        passes_above_fail=decimal_expr(
            load.filter((status == "pass") & (load > first_fail))
        ).str.join(", "),
        # the price shown when no point passed: the candidate's manifest price, not the default
        candidate_price=pl.col("price_per_gpu_hour_usd").drop_nulls().first(),
    )
    summary = summary.with_columns(
        passes_above_fail=pl.when(pl.col("passes_above_fail") == "")
        .then(None)
        .otherwise(pl.col("passes_above_fail"))
    )
    # Unknown points that lie above the capacity (and below the first failure, if any).
    unknown_above = (
        frame.join(
            summary.select([*by, "capacity_load", "first_fail_load"]), on=by, nulls_equal=True
        )
        .filter(
            (status == "unknown")
            & (load > pl.col("capacity_load").fill_null(-math.inf))
            & (load < pl.col("first_fail_load").fill_null(math.inf))
        )
        .group_by(by, maintain_order=True)
        .agg(unknown_above_capacity=decimal_expr(load).str.join(", "))
    )
    summary = summary.join(unknown_above, on=by, how="left", nulls_equal=True)
    # The measured points at the capacity load; the one with the lowest output rate is costed.
    cap_rows = (
        frame.filter(status == "pass")
        .join(summary.select([*by, "capacity_load"]), on=by, nulls_equal=True)
        .filter(load == pl.col("capacity_load"))
        .sort([*by, "output_throughput_tps", "point_id"], nulls_last=True)
        .group_by(by, maintain_order=True)
        .agg(
            capacity_point_id=pl.col("point_id").first(),
            cap_out=pl.col("output_throughput_tps").first(),
            cap_total=pl.col("total_throughput_tps").first(),
            cap_req=pl.col("request_throughput_rps").first(),
            sustained_rate_rps=pl.col("sustained_rate_rps").first(),
            output_tokens_mean=pl.col("output_tokens_mean").first(),
            whole_run_output_tps=pl.col("whole_run_output_tps").first(),
            output_rate_basis=pl.col("output_rate_basis").first(),
            price_per_gpu_hour_usd=pl.col("price_per_gpu_hour_usd").first(),
            repeats=pl.len(),
            repeat_output_tps=pl.col("output_throughput_tps"),
            **{f"cap__{c}": pl.col(c).first() for c in _slo_value_columns(frame, slo)},
        )
    )
    fail_rows = (
        frame.filter(status == "fail")
        .join(summary.select([*by, "first_fail_load"]), on=by, nulls_equal=True)
        .filter(load == pl.col("first_fail_load"))
        .sort([*by, "output_throughput_tps", "point_id"], nulls_last=True)
        .group_by(by, maintain_order=True)
        .first()
        .select(
            *by,
            fail_keep_up=pl.col("keep_up_status"),
            **{f"fail__{c}": pl.col(c) for c in _slo_value_columns(frame, slo)},
        )
    )
    out = (
        summary.join(cap_rows, on=by, how="left", nulls_equal=True)
        .join(fail_rows, on=by, how="left", nulls_equal=True)
        .with_columns(
            price_per_gpu_hour_usd=pl.coalesce("price_per_gpu_hour_usd", "candidate_price")
        )
        .drop("candidate_price")
    )
    out = out.with_columns(
        capacity_status=pl.when(pl.col("sweep") == "other")
        .then(pl.lit("not_searched"))
        .when(pl.col("capacity_load").is_not_null() & pl.col("first_fail_load").is_not_null())
        .then(pl.lit("bracketed"))
        .when(pl.col("capacity_load").is_not_null())
        .then(pl.lit("not_bracketed"))
        .when(pl.col("first_fail_load").is_not_null())
        .then(pl.lit("below_range"))
        .otherwise(pl.lit("unknown")),
        non_monotone=pl.col("passes_above_fail").is_not_null(),
    )
    fraction = _crossing_fraction(out, slo)
    # Interpolating toward a failure that did not keep up would read a growing queue's
    # percentiles as if they were a steady state's.
    do_interp = (
        pl.lit(interpolate)
        & (pl.col("capacity_status") == "bracketed")
        & fraction.is_not_null()
        & (pl.col("sweep") == "open")
        & (pl.col("fail_keep_up") == KEPT_UP)
    )
    measured_rps = pl.min_horizontal(pl.col("capacity_load"), pl.col("sustained_rate_rps"))
    out = out.with_columns(interp_f=fraction).with_columns(
        interpolated=do_interp.fill_null(False),
        capacity_rps=pl.when(pl.col("sweep") == "open")
        .then(
            pl.when(do_interp)
            .then(_lerp("capacity_load", "first_fail_load"))
            .otherwise(measured_rps)
        )
        .when(pl.col("sweep") == "closed")
        .then(pl.col("cap_req")),
    )
    # An interpolated capacity carries the capacity point's tokens per request to its rate.
    scale = pl.col("capacity_rps") / pl.col("sustained_rate_rps")
    out = out.with_columns(
        output_throughput_tps=pl.when(pl.col("interpolated"))
        .then(pl.col("cap_out") * scale)
        .otherwise(pl.col("cap_out")),
        total_throughput_tps=pl.when(pl.col("interpolated"))
        .then(pl.col("cap_total") * scale)
        .otherwise(pl.col("cap_total")),
        output_rate_spread=pl.when(pl.col("repeats") >= 2).then(
            (pl.col("repeat_output_tps").list.max() - pl.col("repeat_output_tps").list.min())
            / pl.col("repeat_output_tps").list.mean()
        ),
        output_rate_cv=pl.when(pl.col("repeats") >= 2).then(
            pl.col("repeat_output_tps").list.std(ddof=1) / pl.col("repeat_output_tps").list.mean()
        ),
    )
    out = out.with_columns(note=_note_expr(interpolate))
    columns = [*group, *CAPACITY_SCHEMA_EXTRA]
    return (
        out.select(columns)
        .with_columns(pl.col(c).cast(t) for c, t in CAPACITY_SCHEMA_EXTRA.items())
        .sort([*group, "sweep"], nulls_last=True)
    )


def _token_rates(evaluated: pl.DataFrame) -> dict[str, pl.Expr]:
    """Per point: the sustained request and token rates (open loop) and the tool's whole-run ones.

    The output rate to cost is the sustained one where the mean output length is known, else the
    whole-run figure (named in ``output_rate_basis``).
    """
    whole_out = float_column(evaluated, "output_tokens_per_s")
    whole_total = pl.coalesce(
        float_column(evaluated, "total_tokens_per_s"),
        whole_out + float_column(evaluated, "input_tokens_per_s"),
    )
    completed = float_column(evaluated, "completed")
    mean_in = pl.coalesce(
        float_column(evaluated, "input_tokens_mean"),
        pl.when(completed > 0).then(float_column(evaluated, "total_input_tokens") / completed),
    )
    mean_out = mean_output_tokens_expr(evaluated)
    is_open = pl.col("sweep") == "open"
    rate = pl.when(is_open).then(send_rate_expr(evaluated))
    sustained = is_open & mean_out.is_not_null()
    return {
        "sustained_rate_rps": rate,
        "output_tokens_mean": mean_out,
        "whole_run_output_tps": whole_out,
        "output_throughput_tps": pl.when(sustained).then(rate * mean_out).otherwise(whole_out),
        "total_throughput_tps": pl.when(sustained & mean_in.is_not_null())
        .then(rate * (mean_in + mean_out))
        .otherwise(whole_total),
        "output_rate_basis": pl.when(sustained)
        .then(pl.lit(SUSTAINED_BASIS))
        .when(is_open)
        .then(pl.lit("whole-run: mean output tokens unknown"))
        .otherwise(pl.lit("whole-run: not an open-loop rate")),
    }


def _slo_value_columns(frame: pl.DataFrame, slo: SloSpec) -> list[str]:
    cols = [c for c in slo.columns() if c in frame.columns]
    return [*cols, "error_rate"]


def _lerp(low: str, high: str) -> pl.Expr:
    return pl.col(low) + pl.col("interp_f") * (pl.col(high) - pl.col(low))


def _crossing_fraction(out: pl.DataFrame, slo: SloSpec) -> pl.Expr:
    """Where, between the last pass (0) and first failure (1), the first broken limit crosses.

    Each broken limit is linearly interpolated in load; the earliest crossing wins. Null when no
    limit can be interpolated (the failure's value or the pass's value is missing).
    """
    pieces: list[pl.Expr] = []
    bounds: list[tuple[str, float]] = [
        (limit.column(slo.itl_definition), limit.max_ms) for limit in slo.limits
    ]
    if slo.max_error_rate is not None:
        bounds.append(("error_rate", slo.max_error_rate))
    for column, bound in bounds:
        low, high = f"cap__{column}", f"fail__{column}"
        if low not in out.columns or high not in out.columns:
            continue
        v0, v1 = pl.col(low), pl.col(high)
        pieces.append(
            pl.when((v1 > bound) & (v0 <= bound) & (v1 > v0))
            .then(((bound - v0) / (v1 - v0)).clip(0.0, 1.0))
            .otherwise(None)
        )
    if not pieces:
        return pl.lit(None, dtype=pl.Float64)
    return pl.min_horizontal(pieces)


def _note_expr(interpolate: bool) -> pl.Expr:
    status = pl.col("capacity_status")
    parts = [
        pl.when(
            pl.lit(interpolate)
            & (status == "bracketed")
            & (pl.col("sweep") == "open")
            & (pl.col("fail_keep_up") != KEPT_UP)
        ).then(
            pl.format(
                "not interpolated: the first failure at {} did not keep up (keep-up {}), so its "
                "percentiles are not a steady state's",
                decimal_expr(pl.col("first_fail_load")),
                pl.col("fail_keep_up"),
            )
        ),
        pl.when(pl.col("sweep") == "closed").then(
            pl.lit(
                "closed loop: load is concurrency; capacity_rps is the achieved request rate, "
                "which hides overload -- not comparable with open-loop rates"
            )
        ),
        pl.when(pl.col("sweep") == "other").then(
            pl.lit("burst / ramp / trace points: no single offered load, not searched")
        ),
        pl.when(status == "not_bracketed").then(
            # The highest pass, not the highest load: a point above it may be unknown.
            pl.format(
                "no failure seen: capacity is at least {}", decimal_expr(pl.col("capacity_load"))
            )
        ),
        pl.when(status == "below_range").then(
            pl.format(
                "no passing point below the first failure at {}: capacity is below it",
                decimal_expr(pl.col("first_fail_load")),
            )
        ),
        pl.when(status == "unknown").then(
            pl.lit("no point is decisive (all unknown): capacity unknown")
        ),
        pl.when(pl.col("non_monotone")).then(
            pl.format(
                "non-monotone: passes at {} above the first failure at {} (not used)",
                pl.col("passes_above_fail"),
                decimal_expr(pl.col("first_fail_load")),
            )
        ),
        pl.when(pl.col("unknown_above_capacity").is_not_null()).then(
            pl.format(
                "unknown points at {} above the capacity: the true capacity may be higher",
                pl.col("unknown_above_capacity"),
            )
        ),
        pl.when(pl.col("interpolated")).then(
            pl.format(
                "INTERPOLATED linearly between pass at {} and failure at {}",
                decimal_expr(pl.col("capacity_load")),
                decimal_expr(pl.col("first_fail_load")),
            )
        ),
    ]
    return pl.concat_str(parts, separator="; ", ignore_nulls=True)
