"""Did the server keep up with an open-loop load point? Queueing through the run, not the drain tail.

In an open-loop run requests are sent on a schedule whatever the server does. When completions
fall behind sends, the queue grows for as long as the run lasts; a short run then shows
percentiles a longer run would not, so such a point is **overloaded** whatever its percentiles
(docs/decision-rules.md#keep-up). A tool's whole-run request throughput cannot
tell: it divides completions by a duration that includes the *drain tail* (the time the last
requests take after sending stops), and one very long answer near the end lengthens that tail
without any queue. So overload is judged by what a queue does (waits grow with a request's
position in the run), and the drain tail never fails a point on its own.

Each open-loop point (``sweep == "open"``) gets a verdict against the rate requests were actually
**sent** (``achieved_rate_rps``, else ``offered_rate_rps``; whether the client produced the
offered load is a separate check, :attr:`pipeline.bench.config.SloSpec.min_achieved_rate_share`):

``send_order_trend`` (per-request rows in send order with a TTFT or an E2E latency: vLLM
``bench serve`` detailed results, with or without ``start_times``, SGLang ``bench_serving``,
``enginefit loadtest``, aiperf, guidellm):
    Requests are ordered by send time ``start_s``; without it by ``request_index`` (vLLM and
    SGLang write their per-request arrays in send order), placed at ``index ÷ send rate``. For
    each wait signal (TTFT, the queue before the first token; E2E, where a server that admits
    everything holds its backlog in the running batch), the growth rate *g* is the change of the
    interquartile mean (the mean of the middle half: steady when prefix-cache hits make the wait
    bimodal, deaf to a few very long answers) from the first quarter of sends to the last,
    divided by the time between the two quarters' median send times. A first-in-first-out
    server completing μ req/s while λ are sent makes a request sent at *t* wait *t* (λ/μ − 1),
    so *g* = λ/μ − 1 and the share ``1 ÷ (1 + g)`` is μ/λ, the completions per send. Overloaded
    when the share is below ``1 − tolerance`` **and** the wait rises with send order by a rank
    test (Spearman ρ × √(n − 1) ≥ ``TREND_Z``, one-sided p ≈ 0.001): both a queue growing
    faster than the tolerance allows and a trend noise cannot make. Judged with at least
    ``MIN_TREND_REQUESTS`` completed requests, and (when E2E is known) a sending window of at
    least ``min_window_latencies`` early-request latencies: before that the server is still
    filling its batch and waits grow on a healthy server too.

``drain_corrected`` (aggregates only: the completion rate bounded on both sides of the drain):
    low = completed ÷ duration ÷ send rate, the drain left in; high = completed ÷ (duration −
    longest E2E) ÷ send rate, the longest possible drain taken off (``e2e_max_ms``; no upper
    bound without it). Only for durations that span first send to last completion
    (``duration_kind`` ``first_send_to_last_done``, ``first_req_to_last_resp``, or ``derived``
    from such a throughput). The server sustained at least the low rate, so low ≥ 1 − tolerance
    is ``kept_up`` (share = low); no drain can explain high < 1 − tolerance, so that is
    ``overloaded`` (share = high); in between the aggregates cannot tell (a growing queue also
    lengthens the longest latency, so high reads about 1 on an overloaded server): ``unknown``
    with both bounds, never a guess either way.

``unknown`` (with the reason) makes the point ``unknown``, never ``pass``. Closed-loop, burst,
ramp and trace points are ``not_applicable``: their load is not a schedule. Per-request data
decides when present; otherwise the aggregates do. The threshold's derivation and the verdicts
on the bundled samples: docs/bench.md ("Did the server keep up?").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from pipeline.bench.config import OverloadRule
from pipeline.bench.frames import column_or_null, float_column

#: How many of the first requests sent give the unloaded E2E latency for the window check.
EARLY_REQUESTS = 10
#: Fewest completed requests for quarters of ten: fewer cannot show a trend.
MIN_TREND_REQUESTS = 40
#: Spearman ρ × √(n − 1) at or above which the wait rises with send order (one-sided p ≈ 0.001):
#: a healthy run's waits are in random order, so noise alone flags one run in a thousand.
TREND_Z = 3.0
#: Durations that run from the first send to the last completion, so the drain is inside them.
DRAIN_DURATION_KINDS = ("first_send_to_last_done", "first_req_to_last_resp", "derived")

KEPT_UP, OVERLOADED, UNKNOWN, NOT_APPLICABLE = "kept_up", "overloaded", "unknown", "not_applicable"
PER_REQUEST_METHOD = "send_order_trend"
AGGREGATE_METHOD = "drain_corrected"

KEEP_UP_SCHEMA: dict[str, pl.DataType] = {
    "keep_up_status": pl.String(),
    "keep_up_method": pl.String(),
    "keep_up_share": pl.Float64(),
    "keep_up_reason": pl.String(),
}


@dataclass(frozen=True)
class KeepUp:
    """One point's verdict."""

    status: str
    method: str | None
    share: float | None
    reason: str


def _pct(share: float) -> str:
    return f"{share * 100:.0f}%"


def interquartile_mean(values: np.ndarray) -> float:
    """The mean of the middle half (values between the 25th and 75th percentiles, inclusive)."""
    low, high = np.percentile(values, [25.0, 75.0])
    return float(values[(values >= low) & (values <= high)].mean())


def rank_trend_z(values: np.ndarray) -> float:
    """Spearman's ρ between send order and ``values``, times √(n − 1): about standard normal
    when the values are in random order (ties get their mean rank)."""
    n = values.size
    ranks = pl.Series(values).rank("average").to_numpy()
    order = np.arange(n, dtype=float)
    rho = float(np.corrcoef(order, ranks)[0, 1]) if np.ptp(ranks) > 0 else 0.0
    return rho * float(np.sqrt(n - 1))


@dataclass(frozen=True)
class _Growth:
    signal: str
    early_s: float
    late_s: float
    gap_s: float
    share: float
    z: float


def _growth(signal: str, send_s: np.ndarray, wait_s: np.ndarray) -> _Growth:
    quarter = send_s.size // 4
    early, late = wait_s[:quarter], wait_s[-quarter:]
    gap = float(np.median(send_s[-quarter:]) - np.median(send_s[:quarter]))
    early_s, late_s = interquartile_mean(early), interquartile_mean(late)
    rate = max(late_s - early_s, 0.0) / gap if gap > 0 else 0.0
    return _Growth(signal, early_s, late_s, gap, 1.0 / (1.0 + rate), rank_trend_z(wait_s))


def keep_up_from_send_order(
    send_s: np.ndarray, waits_s: dict[str, np.ndarray], rule: OverloadRule
) -> KeepUp:
    """The send-order trend method (module docstring).

    ``send_s``: send time of each completed request, in send order; ``waits_s``: per signal
    (``"TTFT"``, ``"E2E"``), that request's wait in seconds, aligned with ``send_s``.
    """

    def unknown(why: str) -> KeepUp:
        return KeepUp(UNKNOWN, PER_REQUEST_METHOD, None, f"keep-up unknown: {why}")

    n = send_s.size
    if n < MIN_TREND_REQUESTS or not waits_s:
        return unknown(
            f"only {n} completed request(s) with a wait in send order; needs ≥ {MIN_TREND_REQUESTS}"
        )
    window = float(send_s[-1] - send_s[0])
    if "E2E" in waits_s:
        unloaded = float(np.median(waits_s["E2E"][:EARLY_REQUESTS]))
        if unloaded > 0 and window < rule.min_window_latencies * unloaded:
            return unknown(
                f"the sending window ({window:.3g} s) is {window / unloaded:.2g} early-request "
                f"latencies ({unloaded:.3g} s); needs ≥ {rule.min_window_latencies:g}"
            )
    growths = [_growth(signal, send_s, wait) for signal, wait in waits_s.items()]
    worst = min(growths, key=lambda g: g.share)
    floor = 1.0 - rule.tolerance
    queued = [g for g in growths if g.share < floor and g.z >= TREND_Z]
    decisive = min(queued, key=lambda g: g.share) if queued else worst
    what = (
        f"{decisive.signal} (mean of the middle half) went from {decisive.early_s:.3g} s in the "
        f"first quarter of sends to {decisive.late_s:.3g} s in the last, {decisive.gap_s:.3g} s "
        f"later: a queue kept pace with {_pct(decisive.share)} of sends (rank trend z "
        f"{decisive.z:.1f}) (tolerance {_pct(rule.tolerance)}, z ≥ {TREND_Z:g})"
    )
    if queued:
        return KeepUp(OVERLOADED, PER_REQUEST_METHOD, decisive.share, f"overloaded: {what}")
    return KeepUp(KEPT_UP, PER_REQUEST_METHOD, decisive.share, f"kept up: {what}")


def keep_up_from_aggregates(
    *,
    send_rate_rps: float | None,
    completed: float | None,
    duration_s: float | None,
    duration_kind: str | None,
    longest_latency_s: float | None,
    rule: OverloadRule,
) -> KeepUp:
    """The drain-corrected bounds (module docstring)."""

    def unknown(why: str) -> KeepUp:
        return KeepUp(UNKNOWN, AGGREGATE_METHOD, None, f"keep-up unknown: {why}")

    if not send_rate_rps or send_rate_rps <= 0 or completed is None:
        return unknown("request counts or send rate not recorded")
    if duration_s is None or duration_s <= 0:
        return unknown("run duration not recorded")
    if duration_kind not in DRAIN_DURATION_KINDS:
        return unknown(
            f"the duration is a {duration_kind or 'unknown'} span, not first send to last "
            "completion, so the drain tail cannot be bounded (per-request waits needed)"
        )
    floor = 1.0 - rule.tolerance
    tolerance = f"(tolerance {_pct(rule.tolerance)})"
    low = completed / duration_s / send_rate_rps
    low_text = (
        f"{completed:g} completed ÷ {duration_s:.4g} s = {completed / duration_s:.4g} req/s, "
        f"drain included, is {_pct(low)} of the send rate {send_rate_rps:.4g} req/s"
    )
    if low >= floor:
        return KeepUp(KEPT_UP, AGGREGATE_METHOD, low, f"kept up: {low_text} {tolerance}")
    if longest_latency_s is None or not 0 < longest_latency_s < duration_s:
        return unknown(
            f"{low_text} and the longest latency is not recorded, so the drain tail cannot be "
            "bounded; per-request waits in send order would tell"
        )
    high_rate = completed / (duration_s - longest_latency_s)
    high = high_rate / send_rate_rps
    high_text = (
        f"with the longest latency ({longest_latency_s:.3g} s) taken off as drain, "
        f"{high_rate:.4g} req/s is {_pct(high)}"
    )
    if high < floor:
        return KeepUp(
            OVERLOADED, AGGREGATE_METHOD, high, f"overloaded: {low_text}; {high_text} {tolerance}"
        )
    return unknown(
        f"{low_text}; {high_text}: the drain tail or a queue, aggregates cannot tell which; "
        "per-request waits in send order would tell"
    )


def send_rate_expr(frame: pl.DataFrame) -> pl.Expr:
    """The rate requests were actually sent: the achieved send rate, else the offered rate."""
    return pl.coalesce(
        float_column(frame, "achieved_rate_rps"), float_column(frame, "offered_rate_rps")
    )


def mean_output_tokens_expr(frame: pl.DataFrame) -> pl.Expr:
    """Mean output tokens per completed request (the reader's mean, else total ÷ completed)."""
    completed = float_column(frame, "completed")
    derived = pl.when(completed > 0).then(float_column(frame, "total_output_tokens") / completed)
    return pl.coalesce(float_column(frame, "output_tokens_mean"), derived)


def _per_request_verdicts(
    per_request: pl.DataFrame, send_rates: dict[str, float | None], rule: OverloadRule
) -> dict[str, KeepUp]:
    """Verdicts for the points whose completed requests carry a TTFT or an E2E latency, in send
    order: by ``start_s`` when every request of the point has one, else by ``request_index`` at
    the point's send rate (a point with neither, e.g. an older vLLM file without latencies, is
    left to the aggregates)."""
    verdicts: dict[str, KeepUp] = {}
    for group in per_request.partition_by("point_id", maintain_order=True):
        point_id = str(group.item(0, "point_id"))
        timed = group.get_column("start_s").null_count() == 0
        rate = send_rates.get(point_id)
        if not timed and not rate:
            continue
        ordered = group.sort("start_s" if timed else "request_index", maintain_order=True)
        done = ordered.filter(pl.col("ok").fill_null(False))
        send_s = (
            done.get_column("start_s").to_numpy()
            if timed
            else done.get_column("request_index").cast(pl.Float64).to_numpy() / rate
        )
        waits = {}
        for signal, column in (("TTFT", "ttft_ms"), ("E2E", "e2e_ms")):
            values = done.get_column(column)
            if values.len() and values.null_count() == 0:
                waits[signal] = values.to_numpy() / 1000.0
        if waits:
            verdicts[point_id] = keep_up_from_send_order(send_s, waits, rule)
    return verdicts


def judge_keep_up(
    points: pl.DataFrame, per_request: pl.DataFrame | None, rule: OverloadRule
) -> pl.DataFrame:
    """``points`` (with a ``sweep`` column) plus :data:`KEEP_UP_SCHEMA` columns."""
    inputs = points.select(
        point_id=pl.col("point_id").cast(pl.String),
        sweep=pl.col("sweep"),
        send_rate_rps=send_rate_expr(points),
        completed=float_column(points, "completed"),
        duration_s=float_column(points, "duration_s"),
        duration_kind=column_or_null(points, "duration_kind", pl.String()),
        longest_latency_s=float_column(points, "e2e_max_ms") / 1000.0,
    )
    send_rates = dict(zip(inputs["point_id"], inputs["send_rate_rps"], strict=True))
    verdicts = (
        _per_request_verdicts(per_request, send_rates, rule) if per_request is not None else {}
    )
    rows: list[KeepUp] = []
    for row in inputs.iter_rows(named=True):
        point_id, sweep = row.pop("point_id"), row.pop("sweep")
        if sweep != "open":
            rows.append(KeepUp(NOT_APPLICABLE, None, None, "not an open-loop rate: not judged"))
        elif point_id in verdicts:
            rows.append(verdicts[point_id])
        else:
            rows.append(keep_up_from_aggregates(**row, rule=rule))
    table = pl.DataFrame(
        {
            "keep_up_status": [r.status for r in rows],
            "keep_up_method": [r.method for r in rows],
            "keep_up_share": [r.share for r in rows],
            "keep_up_reason": [r.reason for r in rows],
        },
        schema=KEEP_UP_SCHEMA,
    )
    return pl.concat([points.drop(list(KEEP_UP_SCHEMA), strict=False), table], how="horizontal")
