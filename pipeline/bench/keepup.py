"""Did the server keep up with an open-loop load point? Overload and the drain tail.

In an open-loop run requests are sent on a schedule whatever the server does. When completions
fall behind sends, the queue grows for as long as the run lasts; a short run then shows
percentiles a longer run would not, so such a point is **overloaded** whatever its percentiles
(DOMAIN.md, "An evaluation that means something"). A tool's whole-run request throughput cannot
tell: it divides completions by a duration that includes the *drain tail* (the time the last
requests take after sending stops), so a short healthy run sits well below its offered rate.

Each open-loop point (``sweep == "open"``) gets a verdict, judged against the rate requests were
actually **sent** (``achieved_rate_rps``, else ``offered_rate_rps``; whether the client produced
the offered load is a separate check, :attr:`pipeline.bench.config.SloSpec.min_achieved_rate_share`):

``per_request_window`` (points whose per-request rows carry send times ``start_s`` and
latencies ``e2e_ms``: vLLM current format, aiperf, guidellm v0.1):
    L0 = the median latency of the first ``EARLY_REQUESTS`` (10) requests sent, before a queue
    could build; T = the last send (the first is at 0). The share is
    ``completions in [L0, T] ÷ sends in [0, T − L0]``: two windows of the same length, the second
    shifted by one unloaded latency, so a server that keeps up completes about as many requests
    in the first as were sent in the second. Judged only when T ≥ ``min_window_latencies`` × L0
    and at least ``MIN_WINDOW_SENDS`` (20) requests fall in the send window.

``drain_corrected`` (aggregates only):
    L = a typical request latency: mean E2E, else median E2E, else mean TTFT + mean TPOT × (mean
    output tokens − 1). The share is ``completed ÷ (duration − L) ÷ send rate``: the completion
    rate over the run with one typical latency of drain taken off. Judged only when the sending
    window (requests sent ÷ send rate) is at least ``min_window_latencies`` typical latencies long
    (a run barely longer than one request's latency never reaches a steady state, so it cannot show
    that the server kept up, nor that it did not), and only for durations that span first send
    to last completion (``duration_kind`` ``first_send_to_last_done``, ``first_req_to_last_resp``,
    or ``derived`` from such a throughput). The drain of the last requests is the *longest*
    latency among them, not the mean, so with varied output lengths the estimate reads a few
    percent low on a healthy run; it is the conservative direction.

What aggregates cannot see: when the queue grows steadily the mean latency already holds half of
the growth, so the drain-corrected share of a server completing μ req/s while λ are sent reads
about 2μ ÷ (λ + μ), not μ ÷ λ: a 25 % overload (μ/λ = 0.8) reads 0.89 and passes a 0.15
tolerance; only overloads beyond about 35 % fail from aggregates, and beyond about 67 % the
window condition makes them ``unknown``. The per-request window reads μ ÷ λ; prefer result files
with per-request send times (vLLM ``--save-detailed``, aiperf ``profile_export.jsonl``).

A point whose share is below ``1 − tolerance`` is ``overloaded`` (it fails the SLO, see
:func:`pipeline.bench.slo.evaluate_slo`); at or above, ``kept_up``; ``unknown`` (with the reason)
when the data cannot judge it, which makes the point ``unknown``, never ``pass``. Closed-loop,
burst, ramp and trace points are ``not_applicable``: their load is not a schedule. Per-request
data with send times decides when present; otherwise the aggregates do. What the verdicts are
on the bundled samples: docs/bench.md ("Did the server keep up?").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from pipeline.bench.config import OverloadRule
from pipeline.bench.frames import column_or_null, float_column

#: How many of the first requests sent give the unloaded latency L0 (per-request method).
EARLY_REQUESTS = 10
#: Fewest sends in the per-request window for its count ratio to mean anything.
MIN_WINDOW_SENDS = 20
#: Durations that run from the first send to the last completion, so the drain is inside them.
DRAIN_DURATION_KINDS = ("first_send_to_last_done", "first_req_to_last_resp", "derived")

KEPT_UP, OVERLOADED, UNKNOWN, NOT_APPLICABLE = "kept_up", "overloaded", "unknown", "not_applicable"
PER_REQUEST_METHOD = "per_request_window"
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


def _verdict(method: str, share: float, rule: OverloadRule, what: str) -> KeepUp:
    tolerance = f"(tolerance {_pct(rule.tolerance)})"
    if share < 1.0 - rule.tolerance:
        return KeepUp(OVERLOADED, method, share, f"overloaded: {what} {tolerance}")
    return KeepUp(KEPT_UP, method, share, f"kept up: {what} {tolerance}")


def keep_up_from_requests(
    starts_s: np.ndarray, done_starts_s: np.ndarray, done_latency_s: np.ndarray, rule: OverloadRule
) -> KeepUp:
    """The per-request window method (module docstring).

    ``starts_s``: send time of every request sent; ``done_starts_s`` / ``done_latency_s``: send
    time and end-to-end latency of every completed request.
    """
    if starts_s.size < 2 or done_starts_s.size == 0:
        return KeepUp(
            UNKNOWN,
            PER_REQUEST_METHOD,
            None,
            f"keep-up unknown: only {starts_s.size} send time(s) and {done_starts_s.size} "
            "completed request(s) with a latency",
        )
    first, last = float(starts_s.min()), float(starts_s.max())
    early = np.argsort(done_starts_s, kind="stable")[:EARLY_REQUESTS]
    unloaded = float(np.median(done_latency_s[early]))
    window = last - first
    if unloaded <= 0 or window < rule.min_window_latencies * unloaded:
        return KeepUp(
            UNKNOWN,
            PER_REQUEST_METHOD,
            None,
            f"keep-up unknown: the sending window ({window:.3g} s) is "
            f"{window / unloaded if unloaded > 0 else math.inf:.2g} early-request latencies "
            f"({unloaded:.3g} s); needs ≥ {rule.min_window_latencies:g}",
        )
    sends = int(np.count_nonzero(starts_s <= last - unloaded))
    ends = done_starts_s + done_latency_s
    completions = int(np.count_nonzero((ends >= first + unloaded) & (ends <= last)))
    if sends < MIN_WINDOW_SENDS:
        return KeepUp(
            UNKNOWN,
            PER_REQUEST_METHOD,
            None,
            f"keep-up unknown: only {sends} requests sent in the window; needs ≥ {MIN_WINDOW_SENDS}",
        )
    share = completions / sends
    return _verdict(
        PER_REQUEST_METHOD,
        share,
        rule,
        f"completions kept pace with {_pct(share)} of sends during the sending window "
        f"({completions} done in [{unloaded:.3g} s, {last:.4g} s] vs {sends} sent in "
        f"[0, {last - unloaded:.4g} s])",
    )


def keep_up_from_aggregates(
    *,
    send_rate_rps: float | None,
    requests_sent: float | None,
    completed: float | None,
    duration_s: float | None,
    duration_kind: str | None,
    latency_s: float | None,
    rule: OverloadRule,
) -> KeepUp:
    """The drain-corrected method (module docstring)."""

    def unknown(why: str) -> KeepUp:
        return KeepUp(UNKNOWN, AGGREGATE_METHOD, None, f"keep-up unknown: {why}")

    if not send_rate_rps or send_rate_rps <= 0 or not requests_sent or completed is None:
        return unknown("request counts or send rate not recorded")
    if duration_s is None or duration_s <= 0:
        return unknown("run duration not recorded")
    if duration_kind not in DRAIN_DURATION_KINDS:
        return unknown(
            f"the duration is a {duration_kind or 'unknown'} span, not first send to last "
            "completion, so the drain tail cannot be corrected (per-request send times needed)"
        )
    if latency_s is None or latency_s <= 0:
        return unknown(
            "no typical request latency (E2E, or TTFT + TPOT × tokens) to correct the drain tail"
        )
    window = requests_sent / send_rate_rps
    if window < rule.min_window_latencies * latency_s:
        return unknown(
            f"run too short to show it kept up: the sending window (≈{window:.3g} s) is "
            f"{window / latency_s:.2g} typical latencies ({latency_s:.3g} s); "
            f"needs ≥ {rule.min_window_latencies:g}"
        )
    if duration_s <= latency_s:
        return unknown(
            f"duration {duration_s:.3g} s is not longer than one latency {latency_s:.3g} s"
        )
    rate = completed / (duration_s - latency_s)
    share = rate / send_rate_rps
    return _verdict(
        AGGREGATE_METHOD,
        share,
        rule,
        f"drain-corrected completion rate {completed:g} ÷ ({duration_s:.4g} s − "
        f"{latency_s:.3g} s) = {rate:.4g} req/s is {_pct(share)} of the send rate "
        f"{send_rate_rps:.4g} req/s",
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


def typical_latency_expr(frame: pl.DataFrame) -> pl.Expr:
    """Seconds: mean E2E, else median E2E, else mean TTFT + mean TPOT × (mean output − 1)."""
    decode = float_column(frame, "tpot_mean_ms") * (mean_output_tokens_expr(frame) - 1.0).clip(0.0)
    return (
        pl.coalesce(
            float_column(frame, "e2e_mean_ms"),
            float_column(frame, "e2e_p50_ms"),
            float_column(frame, "ttft_mean_ms") + decode,
        )
        / 1000.0
    )


def _per_request_verdicts(per_request: pl.DataFrame, rule: OverloadRule) -> dict[str, KeepUp]:
    """Verdicts for the points whose per-request rows have send times and latencies (a point
    with send times but no latencies, e.g. an older vLLM file, is left to the aggregates)."""
    timed = per_request.filter(pl.col("start_s").is_not_null())
    verdicts: dict[str, KeepUp] = {}
    for group in timed.partition_by("point_id", maintain_order=True):
        done = group.filter(pl.col("ok") & pl.col("e2e_ms").is_not_null())
        if done.is_empty():
            continue
        verdicts[str(group.item(0, "point_id"))] = keep_up_from_requests(
            group.get_column("start_s").to_numpy(),
            done.get_column("start_s").to_numpy(),
            done.get_column("e2e_ms").to_numpy() / 1000.0,
            rule,
        )
    return verdicts


def judge_keep_up(
    points: pl.DataFrame, per_request: pl.DataFrame | None, rule: OverloadRule
) -> pl.DataFrame:
    """``points`` (with a ``sweep`` column) plus :data:`KEEP_UP_SCHEMA` columns."""
    verdicts = _per_request_verdicts(per_request, rule) if per_request is not None else {}
    completed = float_column(points, "completed")
    inputs = points.select(
        point_id=pl.col("point_id").cast(pl.String),
        sweep=pl.col("sweep"),
        send_rate_rps=send_rate_expr(points),
        requests_sent=pl.coalesce(
            float_column(points, "num_requests"),
            completed + float_column(points, "failed").fill_null(0.0),
        ),
        completed=completed,
        duration_s=float_column(points, "duration_s"),
        duration_kind=column_or_null(points, "duration_kind", pl.String()),
        latency_s=typical_latency_expr(points),
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
