"""Fitting the step-time model of one deployment from its load points (docs/capacity.md).

Inputs: the deployment's rows of the bench stage's load-point table (``LOAD_POINT_SCHEMA``) that
kept up (an overloaded point's latencies are its queue, not the server), and their per-request
rows (``PER_REQUEST_SCHEMA``) when the tool wrote them.

Per point the fit reads: the send rate λ (achieved, else offered), the mean inter-token gap g
(per request: Σ(e2e − TTFT) ÷ Σ(output − 1); else (mean e2e − mean TTFT) ÷ (mean output − 1);
else the tool's mean per-gap ITL, else mean TPOT), the decoding batch B = λ × mean decode time
(Little's law), the mean context a decode reads K (Σ(out − 1)(prompt + out/2) ÷ Σ(out − 1)),
and the prefill tokens in the step a decode waits on, X = λ × mean prompt × g ÷ (1 − e^(−L))
(prompt tokens arrive at λ × prompt per second, a step lasts g, and the server steps only while
a request is in flight: busy share 1 − e^(−L) for L requests in flight on average, as for
Poisson occupancy).

Then, in order:

1. **prefill per token** — from per-request data: TTFT against prompt length within each point
   (point means removed; the number of prefill chunks at the deployment's budget as a second
   regressor when it varies), so queueing differences between points drop out, pooled by
   inverse variance. Accepted when the slope is positive and at least 4 standard errors;
   otherwise the roofline prior (``prefill_split_basis = "prior"``), and with no prior the
   model is ``Unknown``. Prompts waiting behind each other at load raise the pooled slope, so
   it is the statistic step 5 matches, from the lightest point's slope as a start.
2. **overhead, decode per request and context per token** — least squares of
   g − prefill·X − attention·X₂ (X₂: the attention token pairs of those prompts) over the points
   against the decoding batch B + 1 (the decode a gap belongs to sees itself and, on average,
   the B others in flight): on [1, B + 1, (B + 1)·K] when the points' contexts differ by at least
   1.5× (several request mixes: ``context_basis = "fitted"``); with one mix the data fix the
   overhead and the *total* decode cost and the roofline prior its split between requests and
   context (``"prior"``: both prior coefficients scaled by one fitted factor); with no prior the
   context term is 0 (``"assumed_zero"``, and a transfer to longer prompts is provisional).
   Everything is kept non-negative; one point takes the overhead from the prior.
3. **attention** — the prior's (it needs the model's query heads), else 0
   (``attention_basis``). The benchmark cannot show it: its prompts rarely vary enough.
4. **physical floors** — a coefficient fitted below what the GPU can physically do (the weights
   and the context's KV read at the full datasheet bandwidth, prefill at the full peak FLOPs:
   :func:`pipeline.capacity.prior.physical_floors`) is set to its floor and listed in
   ``floored``.
5. **refinement** — the closed form approximates a queue; Gauss-Newton (Broyden's update after
   one probe, backtracking, at most ``REFINE_PASSES``) so that the model, replaying each point's
   own requests (their send times and lengths; Poisson arrivals at the point's rate when the
   file has none), reproduces each point's mean gap (the overhead and the decode terms'
   common scale) and, with per-request data, each point's mean TTFT and the pooled slope of
   step 1 computed on the replay's TTFTs (also the prefill coefficient and the request
   latency; with several mixes the context coefficient apart). Floors applied again after it.
6. **request latency** — fitted in step 5 with per-request data; else what the measured mean
   TTFT at the lighter half of the points exceeds the model's by (the smallest excess, never
   negative): HTTP, tokenising and scheduling outside the GPU's steps, added to every TTFT and
   E2E but costing no GPU time.
7. **the prefill budget** — unless the team or the deployment states it, budgets ×2 apart (then
   √2 around the best) each scored by the replay's p99 ITL and p95 TTFT error (a step carrying
   a full budget of prompt tokens is what a decode waits through and what a long prompt's TTFT
   is cut into), the few best fitted again in full: the catalog's default when it explains the
   data as well as the best, else the best (``fitted``). The range explaining them as well is
   kept (``limits.budget_range``): a benchmark whose prompts never fill a step shows only a
   lower bound.

Errors reported per point: the model replaying the point against its measured TTFT p50/p95,
ITL p50/p99 and TPOT p50/p99, and (when the caller passes the sweep's measured capacity
bracket) the model's capacity at the benchmark's own mix against it. The **self-check**
(``self_check``): every point at or below the measured capacity within ±``SELF_CHECK_TOLERANCE``
on p95 TTFT and p99 ITL (p99 TPOT where the file's ITL is not one decode step), and that
capacity inside the bracket; a model that fails it has no transferred capacity
(``compute.carry_to_workload``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import polars as pl

from pipeline.capacity.config import CapacityConfig
from pipeline.capacity.kernels import F64, I64
from pipeline.capacity.limits import SchedulingLimits, resolve_limits
from pipeline.capacity.prior import (
    NO_SHAPE,
    ModelShape,
    PriorStep,
    StepFloors,
    physical_floors,
    roofline_prior,
)
from pipeline.capacity.result import (
    CapacityCheck,
    ContextBasis,
    Deployment,
    PointError,
    SelfCheck,
    ServingModel,
    Slo,
    StepCoefficients,
)
from pipeline.capacity.search import (
    RequestSample,
    attention_pairs,
    run_stats,
    search_capacity,
    simulate_at,
)
from pipeline.unknown import Unknown

#: KV tokens assumed while replaying benchmark points (the benchmarked replica's cache is not
#: in the files; a sweep that kept up was not KV-bound).
UNBOUNDED_KV = 10**12
#: Largest number of a point's requests replayed when the file has no per-request data.
SYNTHETIC_REQUESTS = 2000
#: The slowest send rate a point is fitted at: one request in about 11.6 days. A sweep runs
#: faster; a slower rate (a file claiming 1e-300 req/s) would overflow the replay's arrivals.
MIN_FITTED_RATE_RPS = 1e-6
MIN_SLOPE_T = 4.0
CONTEXT_SPREAD = 1.5
REFINE_PASSES = 6
#: The refinement stops once every replayed figure is within this of the measured one.
REFINED = 0.005
MEASURED_STATS = ("ttft_p50", "ttft_p95", "itl_p50", "itl_p99", "tpot_p50", "tpot_p99")
#: A per-gap ITL median below this share of the TPOT median is not one decode step: the tool
#: timed gaps between streamed chunks of several tokens, most of them near zero (docs/capacity.md).
CHUNKED_ITL_SHARE = 0.25
NOT_COMPARABLE = "not comparable"
#: The self-check's bound on p95 TTFT and p99 ITL at the points below the measured capacity.
SELF_CHECK_TOLERANCE = 0.25
SELF_CHECK_STATS = ("ttft_p95", "itl_p99")
STAT_WORDS = {"ttft_p95": "p95 TTFT", "itl_p99": "p99 ITL", "tpot_p99": "p99 TPOT"}
#: Budgets tried against the benchmark's p99 ITL: 64 to 65,536 tokens in steps of √2.
BUDGET_GRID = tuple(round(64 * 2 ** (k / 2)) for k in range(21))
#: A budget explains p99 ITL "as well as the best" when its RMS log error is within this of
#: the best's (the measured p99 itself moves a few per cent between runs).
BUDGET_TOLERANCE = 0.05
#: How many of the best-ranked budgets are fitted again in full before one is chosen.
REFIT_BUDGETS = 3

METHOD = (
    "continuous-batching step model step_s = overhead + prefill x uncached prefill tokens + "
    "decode x decoding requests + context x context tokens read, chunked prefill within the "
    "token budget, batch bounded by max_batch and the replica's KV tokens; prefill per token "
    "from TTFT against prompt length (per-request data) else a roofline prior; overhead and "
    "decode from the mean inter-token gap against the decoding batch (Little's law) across "
    "points, refined by replaying each point through the simulated server"
)


@dataclass(frozen=True)
class _Point:
    point_id: str
    rate: float
    prompt_mean: float
    output_mean: float
    context: float  # mean context tokens a decode reads
    batch: float  # mean decoding requests (Little's law)
    in_flight: float  # mean requests in flight
    gap_s: float  # measured mean inter-token gap
    ttft_mean_s: float | None  # measured mean TTFT
    measured: dict[str, float | Unknown]
    replay: RequestSample  # the point's requests (unit arrivals scaled by rate 1 = seconds)
    replayed: bool
    ttft_s: F64 | None  # per-request TTFT in replay order (None without per-request data)
    prompt_range: tuple[float, float]
    output_range: tuple[float, float]


def _num(row: dict[str, object], key: str) -> float | None:
    value = row.get(key)
    if value is None or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _measured(row: dict[str, object]) -> dict[str, float | Unknown]:
    out: dict[str, float | Unknown] = {}
    for stat in MEASURED_STATS:
        value = _num(row, f"{stat}_ms")
        out[stat] = value if value is not None else Unknown(reason=f"{stat} not in the file")
    itl, tpot = out["itl_p50"], out["tpot_p50"]
    if isinstance(itl, float) and isinstance(tpot, float) and itl < CHUNKED_ITL_SHARE * tpot:
        why = Unknown(
            reason=f"{NOT_COMPARABLE}: the file's ITL p50 ({itl:.3g} ms) is under "
            f"{CHUNKED_ITL_SHARE:.0%} of its TPOT p50 ({tpot:.3g} ms), so the tool timed gaps "
            "between streamed chunks of several tokens (most near zero), not decode steps"
        )
        out["itl_p50"] = why
        if isinstance(out["itl_p99"], float):
            out["itl_p99"] = why
    return out


def _tpot_not_per_token(
    measured: dict[str, float | Unknown], tpot_mean_ms: float | None, gap_ms: float
) -> None:
    """The tool's TPOT statistics marked not comparable when its mean TPOT is not the mean
    decode time per token its own E2E, TTFT and output means imply (off by more than
    ``CHUNKED_ITL_SHARE``): it divided by something other than the tokens decoded."""
    if tpot_mean_ms is None or abs(tpot_mean_ms / gap_ms - 1.0) <= CHUNKED_ITL_SHARE:
        return
    why = Unknown(
        reason=f"{NOT_COMPARABLE}: the file's mean TPOT ({tpot_mean_ms:.3g} ms) is not its "
        f"(E2E − TTFT) ÷ (output − 1) ({gap_ms:.3g} ms), so the tool's TPOT does not count "
        "time per decoded token"
    )
    for stat in ("tpot_p50", "tpot_p99"):
        if isinstance(measured[stat], float):
            measured[stat] = why


def _per_request_mean(row: dict[str, object], total_key: str) -> float | None:
    """A token total over the completed requests (aggregate-only files carry totals)."""
    total, completed = _num(row, total_key), _num(row, "completed")
    return total / completed if total is not None and completed else None


def _synthetic(n: int, prompt: float, output: float, rate: float, seed: int) -> RequestSample:
    rng = np.random.default_rng(seed)
    p = np.full(n, max(round(prompt), 1), dtype=np.int64)
    o = np.full(n, max(round(output), 1), dtype=np.int64)
    return RequestSample(
        prompt=p, uncached=p.copy(), output=o, unit_arrivals=np.cumsum(rng.exponential(1 / rate, n))
    )


def _point(row: dict[str, object], requests: pl.DataFrame | None, seed: int) -> _Point | str:
    """One point's observables, or why it cannot be used."""
    point_id = str(row["point_id"])
    rate = _num(row, "achieved_rate_rps") or _num(row, "offered_rate_rps")
    if rate is None or not MIN_FITTED_RATE_RPS <= rate < math.inf:
        return (
            f"{point_id}: no finite send rate of at least {MIN_FITTED_RATE_RPS:g} req/s "
            "(closed-loop or burst points are not fitted)"
        )
    measured = _measured(row)
    if requests is not None and requests.height >= 10:
        ok = requests.filter(
            pl.col("ok").fill_null(False)
            & pl.col("ttft_ms").is_not_null()
            & pl.col("e2e_ms").is_not_null()
            & pl.col("input_tokens").is_not_null()
            & pl.col("output_tokens").is_not_null()
        )
        if ok.height >= 10:
            return _point_from_requests(point_id, rate, measured, ok, seed)
    prompt = _num(row, "input_tokens_mean") or _per_request_mean(row, "total_input_tokens")
    output = _num(row, "output_tokens_mean") or _per_request_mean(row, "total_output_tokens")
    ttft = _num(row, "ttft_mean_ms")
    e2e = _num(row, "e2e_mean_ms")
    decode_s = (e2e - ttft) / 1000.0 if e2e is not None and ttft is not None else None
    # The gap the means imply, (E2E − TTFT) ÷ (output − 1), is what a decode step took; a
    # tool's own TPOT that disagrees with it counts something else (docs/capacity.md).
    gap_ms = (
        decode_s * 1000.0 / (output - 1.0)
        if decode_s is not None and output is not None and output > 1.5
        else _num(row, "itl_mean_ms") or _num(row, "tpot_mean_ms")
    )
    if prompt is None or output is None or gap_ms is None:
        return f"{point_id}: mean prompt, mean output or mean ITL/TPOT missing"
    _tpot_not_per_token(measured, _num(row, "tpot_mean_ms"), gap_ms)
    if decode_s is None:
        decode_s = max(output - 1.0, 0.0) * gap_ms / 1000.0
    in_flight = rate * (e2e / 1000.0 if e2e is not None else decode_s + (ttft or 0.0) / 1000.0)
    completed = int(_num(row, "completed") or SYNTHETIC_REQUESTS)
    n = max(min(completed, SYNTHETIC_REQUESTS), 50)
    return _Point(
        point_id=point_id,
        rate=rate,
        prompt_mean=prompt,
        output_mean=output,
        context=prompt + output / 2.0,
        batch=rate * decode_s,
        in_flight=in_flight,
        gap_s=gap_ms / 1000.0,
        ttft_mean_s=None if ttft is None else ttft / 1000.0,
        measured=measured,
        replay=_synthetic(n, prompt, output, rate, seed),
        replayed=False,
        ttft_s=None,
        prompt_range=(prompt, prompt),
        output_range=(output, output),
    )


def mean_decode_context(prompt: I64, output: I64) -> float | None:
    """The mean context a decode reads, Σ(out − 1)(prompt + out/2) ÷ Σ(out − 1), over requests
    of these lengths (None: none decodes)."""
    decode_tokens = np.maximum(output.astype(np.int64) - 1, 0)
    weight = float(decode_tokens.sum())
    if weight <= 0:
        return None
    return float(np.sum(decode_tokens * (prompt + output / 2.0)) / weight)


def _point_from_requests(
    point_id: str,
    rate: float,
    measured: dict[str, float | Unknown],
    ok: pl.DataFrame,
    seed: int,
) -> _Point:
    has_starts = ok.get_column("start_s").null_count() == 0
    if has_starts:
        ok = ok.sort("start_s")
    prompt = ok.get_column("input_tokens").to_numpy().astype(np.int64)
    output = ok.get_column("output_tokens").to_numpy().astype(np.int64)
    ttft_s = ok.get_column("ttft_ms").to_numpy().astype(np.float64) / 1000.0
    e2e_s = ok.get_column("e2e_ms").to_numpy().astype(np.float64) / 1000.0
    decode_tokens = np.maximum(output - 1, 0)
    decode_time = np.maximum(e2e_s - ttft_s, 0.0)
    weight = float(decode_tokens.sum())
    gap_s = float(decode_time.sum() / weight) if weight > 0 else math.nan
    context = mean_decode_context(prompt, output) or 0.0
    if has_starts:
        starts = ok.get_column("start_s").to_numpy().astype(np.float64)
        arrivals = starts - starts[0]
        replayed = True
    else:
        rng = np.random.default_rng(seed)
        arrivals = np.cumsum(rng.exponential(1.0 / rate, prompt.shape[0]))
        replayed = False
    p = np.maximum(prompt, 1)
    return _Point(
        point_id=point_id,
        rate=rate,
        prompt_mean=float(prompt.mean()),
        output_mean=float(output.mean()),
        context=context,
        batch=rate * float(decode_time.mean()),
        in_flight=rate * float(e2e_s.mean()),
        gap_s=gap_s,
        ttft_mean_s=float(ttft_s.mean()),
        measured=measured,
        replay=RequestSample(
            prompt=p, uncached=p.copy(), output=np.maximum(output, 1), unit_arrivals=arrivals
        ),
        replayed=replayed,
        ttft_s=ttft_s,
        prompt_range=(float(prompt.min()), float(prompt.max())),
        output_range=(float(output.min()), float(output.max())),
    )


def _prefill_tokens_per_step(point: _Point) -> float:
    busy = 1.0 - math.exp(-max(point.in_flight, 1e-9))
    return point.rate * point.prompt_mean * point.gap_s / busy


def _prefill_slope(
    points: list[_Point], limits: SchedulingLimits, attention: float
) -> tuple[float, float] | str:
    """(slope s/token, standard error) of TTFT on prompt length, each point on its own (so
    queueing differences between points drop out), combined by inverse variance. The prior's
    attention time of each prompt is taken off TTFT first, so the slope is the linear term."""
    return _slope_on(points, [p.ttft_s for p in points], limits, attention)


def _slope_on(
    points: list[_Point], ttfts: list[F64 | None], limits: SchedulingLimits, attention: float
) -> tuple[float, float] | str:
    """:func:`_prefill_slope` of the TTFTs ``ttfts`` (measured, or a replay's) of ``points``."""
    slopes: list[float] = []
    variances: list[float] = []
    for p, ttft in zip(points, ttfts, strict=True):
        if ttft is None or p.replay.size < 10:
            continue
        prompt = p.replay.uncached.astype(np.float64)
        if float(np.ptp(prompt)) == 0.0:
            continue
        chunks = np.ceil(prompt / limits.budget) if limits.chunked else np.ones_like(prompt)
        y = ttft - attention * attention_pairs(p.replay.prompt, p.replay.uncached)
        columns = [np.ones_like(prompt), prompt]
        if float(np.ptp(chunks)) > 0:  # each extra chunk is one more step to wait through
            columns.append(chunks)
        design = np.column_stack(columns)
        coef, *_ = np.linalg.lstsq(design, y, rcond=None)
        residual = y - design @ coef
        dof = max(y.shape[0] - design.shape[1], 1)
        cov = float(residual @ residual) / dof * np.linalg.pinv(design.T @ design)
        if cov[1, 1] > 0:
            slopes.append(float(coef[1]))
            variances.append(float(cov[1, 1]))
    if not slopes:
        return "no per-request TTFT over prompts of different lengths"
    weights = 1.0 / np.array(variances)
    slope = float(np.sum(weights * np.array(slopes)) / np.sum(weights))
    return slope, float(math.sqrt(1.0 / np.sum(weights)))


def _attention_per_step(point: _Point) -> float:
    """Attention token pairs in the step a decode waits on (as X, for the prompts' pairs)."""
    busy = 1.0 - math.exp(-max(point.in_flight, 1e-9))
    pairs = float(np.mean(attention_pairs(point.replay.prompt, point.replay.uncached)))
    return point.rate * pairs * point.gap_s / busy


def _decode_terms(
    points: list[_Point],
    prefill: float,
    attention: float,
    basis: ContextBasis,
    prior: PriorStep | Unknown,
) -> tuple[float, float, float] | str:
    """(overhead, decode per request, context per token) from the per-point mean gaps.

    ``fitted``: overhead, decode and context by least squares (several mixes). ``prior``: the
    data fix overhead and the total decode cost, the prior its split — decode and context are
    the prior's, both scaled by one factor (the data say how much slower than the roofline
    decoding runs, the roofline says how that divides between requests and context).
    ``assumed_zero``: overhead and decode, no context term."""
    seen = np.array([p.batch + 1.0 for p in points])
    ctx = np.array([p.context for p in points])
    y = np.array(
        [
            p.gap_s - prefill * _prefill_tokens_per_step(p) - attention * _attention_per_step(p)
            for p in points
        ]
    )
    if basis == "fitted":
        design = np.column_stack([np.ones_like(seen), seen, seen * ctx])
        coef, *_ = np.linalg.lstsq(design, y, rcond=None)
        overhead, decode, context = (max(float(c), 0.0) for c in coef)
        return overhead, decode, context
    if basis == "prior":
        assert isinstance(prior, PriorStep)
        unit_decode, unit_context = prior.decode_s_per_request, prior.context_s_per_token
    else:
        unit_decode, unit_context = 1.0, 0.0
    load = seen * (unit_decode + unit_context * ctx)  # decode work at the unit coefficients
    if len(points) >= 2 and float(load.max() / load.min()) > 1.2:
        scale, overhead = (float(c) for c in np.polyfit(load, y, 1))
        if scale < 0:
            overhead, scale = max(float(np.mean(y)), 0.0), 0.0
        elif overhead < 0:
            overhead, scale = 0.0, float(np.sum(load * y) / np.sum(load * load))
    elif isinstance(prior, PriorStep):
        overhead = min(prior.overhead_s, float(np.mean(y)))
        scale = max(float(np.mean((y - overhead) / load)), 0.0)
    else:
        return (
            "the points span too little load to separate step overhead from per-request "
            f"decode cost, and there is no prior ({prior.reason})"
        )
    return overhead, scale * unit_decode, scale * unit_context


def _simulate_point(
    coefficients: StepCoefficients,
    point: _Point,
    limits: SchedulingLimits,
    config: CapacityConfig,
) -> tuple[float, float, dict[str, float], F64]:
    """(mean gap s, mean TTFT s, predicted stats in ms, each request's TTFT s) of the model
    replaying ``point``."""
    # The replay's arrivals are already in seconds: rate 1.
    run = simulate_at(coefficients, point.replay, 1.0, limits=limits, kv_tokens=UNBOUNDED_KV)
    # Benchmark statistics include every request, so the replay drops none (no warm-up).
    stats = run_stats(
        run,
        point.replay.output,
        point.rate,
        config.replace(warmup_share=0.0),
        1e9,
        coefficients.request_latency_s,
    )
    predicted = {
        "ttft_p50": stats.ttft_p50_ms,
        "ttft_p95": stats.ttft_p95_ms,
        "itl_p50": stats.itl_p50_ms,
        "itl_p99": stats.itl_p99_ms,
        "tpot_p50": stats.tpot_p50_ms,
        "tpot_p99": stats.tpot_p99_ms,
    }
    ttft = run.ttft_s + coefficients.request_latency_s
    return stats.gap_mean_ms / 1000.0, stats.ttft_mean_ms / 1000.0, predicted, ttft


def _replay(
    coefficients: StepCoefficients, point: _Point, limits: SchedulingLimits
) -> tuple[float, float, F64, F64]:
    """The replay of ``point`` as the refinement and the budget's score read it, without the
    full statistics: (mean gap s, mean TTFT s, each request's TTFT s, every gap s)."""
    run = simulate_at(coefficients, point.replay, 1.0, limits=limits, kv_tokens=UNBOUNDED_KV)
    ttft = run.ttft_s + coefficients.request_latency_s
    gaps = run.gaps_s
    gap = float(gaps.mean()) if gaps.size else math.nan
    return gap, float(np.nanmean(ttft)), ttft, gaps


def _refine(
    coefficients: StepCoefficients,
    points: list[_Point],
    limits: SchedulingLimits,
    config: CapacityConfig,
    *,
    passes: int = REFINE_PASSES,
    measured_slope: float | None = None,
    context_apart: bool = False,
) -> StepCoefficients:
    """Gauss-Newton so the replay reproduces each point's mean gap: on the overhead and the
    decode scale (which multiplies the per-request and the context coefficients together,
    keeping the split the fit chose). With ``measured_slope`` (the data's TTFT-on-prompt slope,
    so per-request TTFTs exist) also on the prefill coefficient and the request latency,
    matching each point's mean TTFT and that slope, the same regression run on the replay's
    TTFTs (the replay chunks and queues prompts as the server did, which the regression's own
    chunk count only approximates). ``context_apart`` (several mixes): the context coefficient
    is a fifth unknown, apart from the decode scale."""
    current = coefficients
    gaps = np.array([p.gap_s for p in points])
    ttfts = np.array([p.ttft_mean_s or math.nan for p in points])
    weight = math.sqrt(len(points))

    def moved(c: StepCoefficients, steps: F64) -> StepCoefficients:
        d = [0.0] * 5
        for k, value in zip(unknowns, steps, strict=True):
            d[k] = float(value)
        factor = max(1.0 + d[1], 0.05)
        return c.model_copy(
            update={
                "overhead_s": max(c.overhead_s + d[0], 0.0),
                "decode_s_per_request": c.decode_s_per_request * factor,
                "context_s_per_token": c.context_s_per_token * factor * max(1.0 + d[4], 0.05),
                "prefill_s_per_token": c.prefill_s_per_token * max(1.0 + d[2], 0.05),
                "request_latency_s": max(c.request_latency_s + d[3], 0.0),
            }
        )

    def residuals(c: StepCoefficients) -> F64:
        replays = [_replay(c, p, limits) for p in points]
        out: F64 = np.array([r[0] for r in replays]) / gaps - 1.0
        if measured_slope is None:
            return out
        means = np.array([r[1] for r in replays]) / ttfts - 1.0
        slope = _slope_on(points, [r[2] for r in replays], limits, c.attention_s_per_pair)
        off = slope[0] / measured_slope - 1.0 if isinstance(slope, tuple) else 0.0
        return np.concatenate([out, np.nan_to_num(means), [weight * off]]).astype(np.float64)

    # overhead, decode scale, prefill, request latency, context apart from decode
    unknowns = [0, 1] + ([2, 3] if measured_slope is not None else [])
    unknowns += [4] if context_apart and current.context_s_per_token > 0 else []
    every_probe = [max(current.overhead_s * 0.05, 1e-5), 0.05, 0.05, 1e-3, 0.05]
    probes = [every_probe[k] for k in unknowns]

    def probed(c: StepCoefficients, at: F64) -> F64:
        eye = np.eye(len(unknowns))
        jacobian = np.column_stack(
            [(residuals(moved(c, eye[k] * probe)) - at) / probe for k, probe in enumerate(probes)]
        )
        if len(points) == 1:  # one gap: the overhead stays
            jacobian[:, 0] = 0.0
        return jacobian

    base = residuals(current)
    jacobian: F64 | None = None
    for _ in range(passes):
        if float(np.max(np.abs(base))) < REFINED:
            break
        if jacobian is None:  # probed when needed; Broyden's update after each step
            jacobian = probed(current, base)
        solved, *_ = np.linalg.lstsq(jacobian, -base, rcond=None)
        steps = np.asarray(solved, dtype=np.float64)
        for _halving in range(4):  # the queue makes the replay nonlinear: backtrack
            trial = moved(current, steps)
            after = residuals(trial)
            if float(after @ after) < float(base @ base):
                break
            steps = steps / 2.0
        else:
            jacobian = None  # no step helped along the updated Jacobian: probe again
            continue
        if float(steps @ steps) > 0:
            jacobian = jacobian + np.outer(after - base - jacobian @ steps, steps) / float(
                steps @ steps
            )
        current, base = trial, after
    return current


def _request_latency(
    coefficients: StepCoefficients,
    points: list[_Point],
    limits: SchedulingLimits,
    config: CapacityConfig,
) -> float:
    """The latency a request carries outside the GPU steps: measured minus modelled mean TTFT
    at the lighter half of the points (where queueing, which the model does reproduce, is
    smallest); the smallest of them, so a prefill misfit at one mix's long prompts is not
    charged to every request; never negative."""
    lighter = sorted((p for p in points if p.ttft_mean_s is not None), key=lambda p: p.rate)
    lighter = lighter[: max(1, math.ceil(len(lighter) / 2))]
    gaps = [
        p.ttft_mean_s - _simulate_point(coefficients, p, limits, config)[1]
        for p in lighter
        if p.ttft_mean_s is not None
    ]
    return max(min(gaps), 0.0) if gaps else 0.0


def _relative(predicted: float, measured: float | Unknown) -> float | Unknown:
    if isinstance(measured, Unknown):
        return measured
    if measured <= 0 or not math.isfinite(predicted):
        return Unknown(reason="measured value is zero or prediction undefined")
    return predicted / measured - 1.0


@dataclass(frozen=True)
class _Fitted:
    coefficients: StepCoefficients
    split_basis: Literal["fitted", "prior"]
    context_basis: ContextBasis
    floored: list[str]


def _floor(
    coefficients: StepCoefficients, floors: StepFloors | Unknown, floored: list[str]
) -> StepCoefficients:
    """Every coefficient at least its physical floor; each one raised is listed in ``floored``
    (once, with the value it was fitted at)."""
    if isinstance(floors, Unknown):
        return coefficients
    bounds = {
        "overhead_s": floors.overhead_s,
        "prefill_s_per_token": floors.prefill_s_per_token,
        "attention_s_per_pair": floors.attention_s_per_pair,
        "context_s_per_token": floors.context_s_per_token,
    }
    update: dict[str, float] = {}
    for name, bound in bounds.items():
        value = float(getattr(coefficients, name))
        if bound is not None and value < bound * (1 - 1e-9):
            update[name] = bound
            if not any(f.startswith(f"{name}:") for f in floored):
                floored.append(f"{name}: fitted {value:.4g} s, below its floor {bound:.4g} s")
    return coefficients.model_copy(update=update) if update else coefficients


def _fit_coefficients(
    usable: list[_Point],
    limits: SchedulingLimits,
    prior: PriorStep | Unknown,
    floors: StepFloors | Unknown,
    attention: float,
    config: CapacityConfig,
    deployment: Deployment,
    notes: list[str],
) -> _Fitted | Unknown:
    """Steps 1-6 of the module docstring at the budget ``limits`` give."""
    slope = _prefill_slope(usable, limits, attention)
    split_basis: Literal["fitted", "prior"]
    if isinstance(slope, tuple) and slope[0] > 0 and slope[0] >= MIN_SLOPE_T * slope[1]:
        # The pooled slope is the statistic the refinement matches; it starts from the lightest
        # point's, the least raised by prompts waiting behind each other.
        split_basis = "fitted"
        lightest = _prefill_slope(sorted(usable, key=lambda p: p.rate)[:1], limits, attention)
        start_ok = isinstance(lightest, tuple) and lightest[0] > 0
        prefill = (
            min(lightest[0], slope[0]) if isinstance(lightest, tuple) and start_ok else slope[0]
        )
    elif isinstance(prior, PriorStep):
        why = (
            slope
            if isinstance(slope, str)
            else (
                f"TTFT slope {slope[0] * 1e3:.4g} ± {slope[1] * 1e3:.2g} ms/token is not significant"
            )
        )
        notes.append(f"prefill per token from the roofline prior: {why}")
        prefill, split_basis = prior.prefill_s_per_token, "prior"
    else:
        why = slope if isinstance(slope, str) else "the TTFT slope is not significant"
        return Unknown(
            reason=f"prefill cost cannot be separated from decode for {deployment.describe()}: "
            f"{why}, and there is no roofline prior ({prior.reason})"
        )
    contexts = [p.context for p in usable]
    context_basis: ContextBasis
    if len(usable) >= 3 and max(contexts) / max(min(contexts), 1.0) >= CONTEXT_SPREAD:
        context_basis = "fitted"
    elif isinstance(prior, PriorStep):
        context_basis = "prior"
    else:
        context_basis = "assumed_zero"
        notes.append(
            "context cost per token assumed 0: one request mix cannot separate it from the "
            f"per-request decode cost and there is no prior ({prior.reason})"
        )
    terms = _decode_terms(usable, prefill, attention, context_basis, prior)
    if isinstance(terms, str):
        return Unknown(reason=f"{deployment.describe()}: {terms}")
    overhead, decode, context_value = terms
    floored: list[str] = []
    coefficients = _floor(
        StepCoefficients(
            overhead_s=overhead,
            prefill_s_per_token=prefill,
            attention_s_per_pair=attention,
            decode_s_per_request=decode,
            context_s_per_token=context_value,
        ),
        floors,
        floored,
    )
    refined = _refine(
        coefficients,
        usable,
        limits,
        config,
        measured_slope=slope[0] if split_basis == "fitted" and isinstance(slope, tuple) else None,
        context_apart=context_basis == "fitted",
    )
    coefficients = _floor(refined, floors, floored)
    if split_basis != "fitted":  # no per-request TTFTs: the refinement did not fit it
        coefficients = coefficients.model_copy(
            update={"request_latency_s": _request_latency(coefficients, usable, limits, config)}
        )
    return _Fitted(coefficients, split_basis, context_basis, floored)


def _replay_error(
    coefficients: StepCoefficients,
    points: list[_Point],
    limits: SchedulingLimits,
    config: CapacityConfig,
) -> float:
    """RMS log error of the replayed p99 ITL and p95 TTFT against the measured ones."""
    errors = []
    for p in points:
        _, _, ttft, gaps = _replay(coefficients, p, limits)
        predicted = {
            "ttft_p95": float(np.nanpercentile(ttft, 95)) * 1000.0,
            "itl_p99": float(np.percentile(gaps, 99)) * 1000.0 if gaps.size else math.nan,
        }
        for stat in SELF_CHECK_STATS:
            measured = p.measured[stat]
            if isinstance(measured, float) and measured > 0 and math.isfinite(predicted[stat]):
                errors.append(math.log(max(predicted[stat], 1e-9) / measured))
    return float(np.sqrt(np.mean(np.square(errors))))


def _most_prefill_per_step(
    coefficients: StepCoefficients, points: list[_Point], limits: SchedulingLimits
) -> int:
    """The most prompt tokens any step takes when the budget does not bound them: budgets
    above it replay alike."""
    unbounded = limits.moved(budget=2**40)
    most = 1
    for p in points:
        run = simulate_at(coefficients, p.replay, 1.0, limits=unbounded, kv_tokens=UNBOUNDED_KV)
        most = max(most, run.gap_prefill_max)
        most = max(most, int(p.replay.uncached.max()))
    return most


def _at_other_budget(
    coefficients: StepCoefficients, points: list[_Point], at: SchedulingLimits
) -> StepCoefficients:
    """The model fitted at another budget moved to ``at``: the prefill coefficient scaled so
    the replay's TTFT-on-prompt slope is the data's again (the slope depends on how prompts
    are chunked; the other coefficients hardly do)."""
    measured = _prefill_slope(points, at, coefficients.attention_s_per_pair)
    replayed = _slope_on(
        points,
        [_replay(coefficients, p, at)[2] for p in points],
        at,
        coefficients.attention_s_per_pair,
    )
    if (
        not isinstance(measured, tuple)
        or measured[0] < MIN_SLOPE_T * measured[1]  # not significant: the prior's stays
        or not isinstance(replayed, tuple)
        or replayed[0] <= 0
    ):
        return coefficients
    factor = min(max(measured[0] / replayed[0], 0.25), 4.0)
    return coefficients.model_copy(
        update={"prefill_s_per_token": coefficients.prefill_s_per_token * factor}
    )


def _choose_budget(
    fitted: _Fitted,
    points: list[_Point],
    limits: SchedulingLimits,
    refit: Callable[[SchedulingLimits], _Fitted | Unknown],
    config: CapacityConfig,
    notes: list[str],
) -> tuple[SchedulingLimits, _Fitted]:
    """Step 7 of the module docstring: the budget the model runs with, the model fitted at it,
    and the range of budgets the data allow. Each budget tried moves the fitted model to it
    (:func:`_at_other_budget`) and is scored by its replay's p99 ITL and p95 TTFT error:
    budgets ×2 apart up to the most a step takes unbounded, then the best's neighbours √2
    away. A budget other than ``limits``' is fitted again in full (``refit``)."""
    judged = [
        p for p in points if any(isinstance(p.measured[stat], float) for stat in SELF_CHECK_STATS)
    ]
    if not judged:
        notes.append(
            "the prefill budget is not checked against the data: no point has a comparable "
            "p99 ITL or p95 TTFT"
        )
        return limits, fitted
    most = _most_prefill_per_step(fitted.coefficients, judged, limits)
    top = 2 ** math.ceil(math.log2(most))  # above `most`, every budget replays alike
    tried: dict[int, float] = {}

    def score(budget: int) -> float:
        key = min(budget, top)
        if key not in tried:
            at = limits.moved(budget=key)
            moved = (
                fitted.coefficients
                if key == limits.budget
                else _at_other_budget(fitted.coefficients, points, at)
            )
            tried[key] = _replay_error(moved, judged, at, config)
        tried[budget] = tried[key]
        return tried[key]

    for budget in BUDGET_GRID[::2]:
        score(budget)
        if budget > most:
            break
    best = min(tried, key=lambda b: (tried[b], b))
    for neighbour in (round(best / math.sqrt(2)), round(best * math.sqrt(2))):
        if BUDGET_GRID[0] <= neighbour <= 2 * most:
            score(neighbour)
    own = score(limits.budget)
    # The few best are fitted again in full and scored so (the moved models only rank them),
    # unless the budget already fitted explains the data as well as any moved one.
    refits: dict[int, _Fitted] = {}
    ranked = sorted({min(b, top) for b in tried}, key=lambda b: tried[b])
    kept = own <= tried[ranked[0]] + BUDGET_TOLERANCE
    for budget in [] if kept else ranked[:REFIT_BUDGETS]:
        if budget == min(limits.budget, top):
            continue
        at = limits.moved(budget=budget)
        again = refit(at)
        if not isinstance(again, Unknown):
            refits[budget] = again
            tried[budget] = _replay_error(again.coefficients, judged, at, config)
            for b in [b for b in tried if min(b, top) == budget]:
                tried[b] = tried[budget]
    best = min(tried, key=lambda b: (tried[b], b))
    good = sorted(b for b in tried if tried[b] <= tried[best] + BUDGET_TOLERANCE)
    low, high = good[0], (None if good[-1] >= most else good[-1])
    if limits.budget in good:
        return limits.model_copy(update={"budget_range": (low, high)}), fitted
    span = f"{low:,}" + (f" to {high:,}" if high is not None else " or more")
    detail = (
        f"the budget whose replay best explains the points' p99 ITL and p95 TTFT (RMS error "
        f"{tried[best]:.0%}; {span} tokens explain them as well); the "
        f"{limits.token_budget.source} value {limits.budget:,} gives {own:.0%}"
    )
    chosen = limits.with_budget(best, "fitted", detail, (low, high))
    found = refits.get(min(best, top))
    if found is None:
        again = refit(chosen)
        found = again if not isinstance(again, Unknown) else fitted
    return chosen, found


def fit_serving_model(
    points: pl.DataFrame,
    per_request: pl.DataFrame | None,
    deployment: Deployment,
    *,
    config: CapacityConfig,
    limits: SchedulingLimits | None = None,
    model_shape: ModelShape | None = None,
    shape_source: str | None = None,
    measured_capacity: tuple[float, float | None] | None = None,
    slo: Slo | None = None,
) -> ServingModel | Unknown:
    """The serving model of ``deployment`` fitted on ``points`` (its kept-up load points).

    ``per_request`` may hold other points' rows too (only this deployment's point ids are read).
    ``limits``: the deployment's scheduling limits (:func:`pipeline.capacity.limits.resolve_limits`;
    None: the configuration's, else assumed). ``model_shape`` enables the roofline prior, the
    attention term and the physical floors (``shape_source`` says whose shape it is).
    ``measured_capacity`` = (highest passing rate, first failing rate or None) of the sweep,
    with ``slo``, adds the capacity check to the self-check.
    """
    notes: list[str] = []
    by_point: dict[str, pl.DataFrame] = {}
    if per_request is not None and per_request.height:
        wanted = per_request.filter(
            pl.col("point_id").is_in(points.get_column("point_id").to_list())
        )
        by_point = {
            str(key[0]): frame for key, frame in wanted.group_by("point_id", maintain_order=True)
        }
    usable: list[_Point] = []
    for row in points.to_dicts():
        point = _point(row, by_point.get(str(row["point_id"])), config.seed)
        if isinstance(point, str):
            notes.append(point)
        elif not math.isfinite(point.gap_s) or point.gap_s <= 0:
            notes.append(f"{point.point_id}: no inter-token gaps (one-token answers)")
        else:
            usable.append(point)
    if not usable:
        return Unknown(
            reason="no usable load point for "
            + deployment.describe()
            + (f" ({'; '.join(notes)})" if notes else "")
        )
    if limits is None:
        limits = resolve_limits(
            manifest_args={},
            recorded_args={},
            defaults=None,
            config=config,
            manifest_file=None,
            gpu_count=deployment.gpu_count,
        )
    prior = roofline_prior(deployment.gpu_type, deployment.gpu_count, model_shape)
    floors = physical_floors(deployment.gpu_type, deployment.gpu_count, model_shape)
    if (
        model_shape is None
        and shape_source
        and isinstance(prior, Unknown)
        and NO_SHAPE in prior.reason
    ):
        # Say whose shape is missing: the caller looked for it.
        prior = floors = Unknown(reason=shape_source.removeprefix("none: "))
    attention_basis: Literal["prior", "assumed_zero"]
    if isinstance(prior, PriorStep) and prior.attention_s_per_pair is not None:
        attention, attention_basis = prior.attention_s_per_pair, "prior"
    else:
        attention, attention_basis = 0.0, "assumed_zero"
        notes.append(
            "prefill attention (growing with the square of the prompt) assumed 0: "
            + (
                "the model's attention heads are not given"
                if isinstance(prior, PriorStep)
                else f"no roofline prior ({prior.reason})"
            )
        )
    fitted = _fit_coefficients(usable, limits, prior, floors, attention, config, deployment, notes)
    if isinstance(fitted, Unknown):
        return fitted
    if not limits.budget_stated():
        limits, fitted = _choose_budget(
            fitted,
            usable,
            limits,
            lambda at: _fit_coefficients(
                usable, at, prior, floors, attention, config, deployment, []
            ),
            config,
            notes,
        )
    coefficients = fitted.coefficients
    errors: list[PointError] = []
    squared: list[float] = []
    for p in usable:
        gap, ttft_mean, predicted, _ = _simulate_point(coefficients, p, limits, config)
        squared.append((gap / p.gap_s - 1.0) ** 2)
        if p.ttft_s is not None:
            squared.append((ttft_mean / float(np.mean(p.ttft_s)) - 1.0) ** 2)
        errors.append(
            PointError(
                point_id=p.point_id,
                rate_rps=p.rate,
                requests=p.replay.size,
                replayed=p.replayed,
                measured=p.measured,
                predicted=predicted,
                error={k: _relative(predicted[k], p.measured[k]) for k in MEASURED_STATS},
            )
        )
    spread = math.sqrt(sum(squared) / len(squared))
    prompt_lo = min(p.prompt_range[0] for p in usable)
    prompt_hi = max(p.prompt_range[1] for p in usable)
    output_lo = min(p.output_range[0] for p in usable)
    output_hi = max(p.output_range[1] for p in usable)
    weights = np.array([p.replay.size for p in usable], dtype=np.float64)
    model = ServingModel(
        deployment=deployment,
        coefficients=coefficients,
        limits=limits,
        prefill_split_basis=fitted.split_basis,
        context_basis=fitted.context_basis,
        attention_basis=attention_basis,
        points_used=len(usable),
        bench_prompt_tokens_mean=float(
            np.average([p.prompt_mean for p in usable], weights=weights)
        ),
        bench_output_tokens_mean=float(
            np.average([p.output_mean for p in usable], weights=weights)
        ),
        bench_prompt_tokens_range=(prompt_lo, prompt_hi),
        bench_output_tokens_range=(output_lo, output_hi),
        residual_spread=spread,
        point_errors=errors,
        capacity_check=None,
        self_check=SelfCheck(
            passed=True,
            tolerance=SELF_CHECK_TOLERANCE,
            points_checked=0,
            worst="",
            worst_error=None,
            reason=None,
        ),
        prior=prior.description if isinstance(prior, PriorStep) else prior,
        model_shape=shape_source or ("given" if model_shape is not None else "none"),
        floors=floors,
        floored=fitted.floored,
        notes=notes,
        method=METHOD,
    )
    check = (
        _capacity_check(model, usable, measured_capacity, slo, config)
        if measured_capacity is not None and slo is not None
        else None
    )
    return model.model_copy(
        update={
            "capacity_check": check,
            "self_check": _self_check(model, check, measured_capacity),
        }
    )


def _self_check(
    model: ServingModel,
    check: CapacityCheck | None,
    measured_capacity: tuple[float, float | None] | None,
) -> SelfCheck:
    """The model against its own benchmark (module docstring): the worst p95 TTFT / p99 ITL
    error over the points at or below the measured capacity, then the capacity bracket."""
    limit = measured_capacity[0] * 1.001 if measured_capacity is not None else math.inf
    checked = [e for e in model.point_errors if e.rate_rps <= limit]
    worst: tuple[float, str, float] | None = None
    for e in checked:
        # Where the file's per-gap ITL is not one decode step, its TPOT stands in for it.
        stats = (
            SELF_CHECK_STATS
            if isinstance(e.error["itl_p99"], float)
            else (
                "ttft_p95",
                "tpot_p99",
            )
        )
        for stat in stats:
            error = e.error[stat]
            if isinstance(error, float) and (worst is None or abs(error) > abs(worst[0])):
                measured = e.measured[stat]
                assert isinstance(measured, float)
                text = (
                    f"{STAT_WORDS[stat]} at "
                    f"{e.point_id.rsplit('/', 1)[-1]} ({e.rate_rps:.3g} req/s): predicted "
                    f"{e.predicted[stat]:,.1f} ms against {measured:,.1f} ms measured "
                    f"({error:+.0%})"
                )
                worst = (error, text, error)
    tolerance = SELF_CHECK_TOLERANCE
    reason: str | None = None
    if worst is not None and abs(worst[0]) > tolerance:
        reason = f"{worst[1]}, beyond ±{tolerance:.0%}"
    elif check is not None and check.within_bracket is False:
        predicted = check.predicted_rps
        assert isinstance(predicted, float)
        bracket = (
            f"at least {check.measured_low_rps:.3g}"
            if check.measured_high_rps is None
            else f"{check.measured_low_rps:.3g}–{check.measured_high_rps:.3g}"
        )
        reason = (
            f"its capacity at the benchmark's own mix, {predicted:.3g} req/s, is outside the "
            f"measured {bracket} req/s"
        )
    elif check is not None and isinstance(check.predicted_rps, Unknown):
        reason = (
            f"it finds no capacity at the benchmark's own mix ({check.predicted_rps.reason}), "
            f"where the sweep passed {check.measured_low_rps:.3g} req/s"
        )
    return SelfCheck(
        passed=reason is None,
        tolerance=tolerance,
        points_checked=len(checked),
        worst="" if worst is None else worst[1],
        worst_error=None if worst is None else worst[2],
        reason=None
        if reason is None
        else f"the serving model does not reproduce its own benchmark: {reason}",
    )


def _capacity_check(
    model: ServingModel,
    points: list[_Point],
    measured: tuple[float, float | None],
    slo: Slo,
    config: CapacityConfig,
) -> CapacityCheck:
    """The model's capacity at the benchmark's own mix against the sweep's measured bracket
    (its band overlapping it counts as within): the largest point's requests, drawn
    with replacement up to the configured sample size (a short run hides a slowly growing
    queue, so the check runs as long as the workload's search does)."""
    largest = max(points, key=lambda p: p.replay.size)
    rng = np.random.default_rng(config.seed)
    index = rng.integers(0, largest.replay.size, config.sample_requests)
    sample = RequestSample(
        prompt=largest.replay.prompt[index],
        uncached=largest.replay.uncached[index],
        output=largest.replay.output[index],
        unit_arrivals=np.cumsum(rng.exponential(1.0, config.sample_requests)),
    )
    found = search_capacity(
        model.coefficients, sample, slo, limits=model.limits, kv_tokens=UNBOUNDED_KV, config=config
    )
    low, high = measured
    if isinstance(found, Unknown):
        return CapacityCheck(
            measured_low_rps=low, measured_high_rps=high, predicted_rps=found, within_bracket=None
        )
    predicted = found.rate_rps
    # The model's capacity with its band (the spread the transfer carries, at least
    # ``min_band_spread``) overlaps the bracket: within the model's own stated error.
    spread = min(max(model.residual_spread, config.min_band_spread), 0.5)
    within = predicted * (1 + spread) >= low * 0.999 and (
        high is None or predicted * (1 - spread) <= high * 1.001
    )
    return CapacityCheck(
        measured_low_rps=low,
        measured_high_rps=high,
        predicted_rps=predicted,
        within_bracket=within,
    )


def deployment_of(row: dict[str, object]) -> Deployment:
    """The deployment a load-point row belongs to."""
    return Deployment(
        engine=str(row["engine"]),
        engine_version=None if row.get("engine_version") is None else str(row["engine_version"]),
        gpu_type=str(row["gpu_type"]),
        gpu_count=int(row["gpu_count"]),  # type: ignore[call-overload]
        model=None if row.get("model") is None else str(row["model"]),
        label=None if row.get("label") is None else str(row["label"]),
        backend=None if row.get("backend") is None else str(row["backend"]),
    )
