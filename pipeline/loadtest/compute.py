"""Pure functions over a load test's outcomes: the per-request table, each rate's summary, and
the vLLM ``bench serve``-compatible result that ``enginefit bench`` (and other tools) read.

Definitions (the same as ``vllm bench serve``, so the numbers compare): time to first token =
first content chunk − send; inter-token latency = every gap between content chunks, pooled;
TPOT = (end-to-end − TTFT) ÷ (output tokens − 1) for requests with more than one token;
output tokens = the server's ``usage.completion_tokens`` when it sent usage, else the number of
content chunks (``output_tokens_source`` says which: a server that sends several tokens per
chunk is then undercounted, and the summary says usage was missing). Percentiles are numpy's
linear ones over completed requests. Warm-up sends are measured but excluded from every figure.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import polars as pl

from pipeline.errors import ConfigError
from pipeline.loadtest.client import Outcome
from pipeline.loadtest.config import LoadtestConfig, check_endpoint
from pipeline.loadtest.plan import RatePlan, TraceSample, plan_rate, prompt_text, prompt_words

REQUEST_SCHEMA = pl.Schema(
    {
        "rate_rps": pl.Float64(),
        "index": pl.Int64(),
        "trace_row": pl.Int64(),
        "warmup": pl.Boolean(),
        "scheduled_s": pl.Float64(),
        "sent_s": pl.Float64(),
        "late_ms": pl.Float64(),
        "ttft_ms": pl.Float64(),
        "e2e_ms": pl.Float64(),
        "itl_ms": pl.List(pl.Float64()),
        "tpot_ms": pl.Float64(),
        "prompt_tokens": pl.Int64(),
        "max_tokens": pl.Int64(),
        "usage_prompt_tokens": pl.Int64(),
        "usage_cached_tokens": pl.Int64(),
        "usage_completion_tokens": pl.Int64(),
        "output_chunks": pl.Int64(),
        "output_tokens": pl.Int64(),
        "output_tokens_source": pl.String(),
        "finish_reason": pl.String(),
        "http_status": pl.Int64(),
        "ok": pl.Boolean(),
        "error_kind": pl.String(),
        "error_detail": pl.String(),
    }
)


def request_frame(plan: RatePlan, trace: TraceSample, outcomes: Sequence[Outcome]) -> pl.DataFrame:
    """One row per planned send of one rate (dropped and interrupted ones included)."""
    rows: list[dict[str, Any]] = []
    for o in outcomes:
        row = int(plan.trace_rows[o.index])
        ok = o.error_kind is None
        chunks = len(o.chunk_times)
        first = o.chunk_times[0] if chunks else None
        sent = o.sent_s
        usage_out = o.usage_completion_tokens
        tokens = usage_out if usage_out is not None else chunks
        ttft = (first - sent) * 1000.0 if ok and first is not None and sent is not None else None
        e2e = (o.end_s - sent) * 1000.0 if ok and o.end_s is not None and sent is not None else None
        gaps: list[float] = (
            (np.diff(np.asarray(o.chunk_times)) * 1000.0).tolist() if ok and chunks > 1 else []
        )
        tpot = (
            (e2e - ttft) / (tokens - 1)
            if ttft is not None and e2e is not None and tokens > 1
            else None
        )
        rows.append(
            {
                "rate_rps": plan.rate_rps,
                "index": o.index,
                "trace_row": row,
                "warmup": o.index < plan.warmup_count,
                "scheduled_s": o.scheduled_s,
                "sent_s": sent,
                "late_ms": (sent - o.scheduled_s) * 1000.0 if sent is not None else None,
                "ttft_ms": ttft,
                "e2e_ms": e2e,
                "itl_ms": gaps,
                "tpot_ms": tpot,
                "prompt_tokens": int(trace.prompt_tokens[row]),
                "max_tokens": int(trace.output_tokens[row]),
                "usage_prompt_tokens": o.usage_prompt_tokens,
                "usage_cached_tokens": o.usage_cached_tokens,
                "usage_completion_tokens": usage_out,
                "output_chunks": chunks,
                "output_tokens": tokens if ok else None,
                "output_tokens_source": ("usage" if usage_out is not None else "chunks")
                if ok
                else None,
                "finish_reason": o.finish_reason,
                "http_status": o.http_status,
                "ok": ok,
                "error_kind": o.error_kind,
                "error_detail": o.error_detail,
            }
        )
    return pl.DataFrame(rows, schema=REQUEST_SCHEMA, orient="row")


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None


def _stats(values: np.ndarray) -> dict[str, float | None]:
    return {
        "mean": float(values.mean()) if values.size else None,
        "median": _pct(values, 50),
        "std": float(values.std()) if values.size else None,
        **{f"p{q}": _pct(values, q) for q in (90, 95, 99)},
    }


def peak_in_flight(sent_s: np.ndarray, end_s: np.ndarray) -> int:
    """Most requests in flight at once (an end frees its slot before a send at the same time)."""
    if sent_s.size == 0:
        return 0
    events = np.concatenate(
        [np.stack([sent_s, np.ones_like(sent_s)], 1), np.stack([end_s, -np.ones_like(end_s)], 1)]
    )
    order = np.lexsort((events[:, 1], events[:, 0]))
    return int(np.cumsum(events[order, 1]).max())


def window_rate(times_s: np.ndarray) -> float | None:
    """(n − 1) ÷ (last − first): the rate of a run of sends, the estimator the bench stage
    applies to send times (:func:`pipeline.bench.readers.vllm.send_rate`)."""
    if times_s.size < 2 or times_s.max() <= times_s.min():
        return None
    return float((times_s.size - 1) / (times_s.max() - times_s.min()))


def rate_summary(requests: pl.DataFrame, plan: RatePlan, *, interrupted: bool) -> dict[str, Any]:
    """The figures of one rate that a person reads first (warm-up excluded)."""
    measured = requests.filter(~pl.col("warmup"))
    sent = measured.filter(pl.col("sent_s").is_not_null())
    done = measured.filter(pl.col("ok"))
    errors = Counter(measured.get_column("error_kind").drop_nulls().to_list())
    late = sent.get_column("late_ms").to_numpy()
    gaps = np.concatenate(
        [np.asarray(g, dtype=np.float64) for g in done.get_column("itl_ms").to_list()]
        or [np.zeros(0)]
    )
    with_usage = done.filter(pl.col("usage_completion_tokens").is_not_null())
    asked = done.get_column("max_tokens").to_numpy()
    got = done.get_column("output_tokens").to_numpy()
    prompt_usage = done.filter(pl.col("usage_prompt_tokens").is_not_null())
    planned_prompt = int(prompt_usage.get_column("prompt_tokens").sum())
    return {
        "rate_rps": plan.rate_rps,
        "planned": plan.sends,
        "warmup": plan.warmup_count,
        "measured": measured.height,
        "sent": sent.height,
        "completed": done.height,
        "failed": measured.height - done.height,
        "errors": dict(sorted(errors.items())),
        "interrupted": interrupted,
        "arrival_cv": None if math.isnan(plan.arrival_cv) else plan.arrival_cv,
        "offered_rate_rps": window_rate(measured.get_column("scheduled_s").to_numpy()),
        "achieved_send_rate_rps": window_rate(sent.get_column("sent_s").to_numpy()),
        "late_ms": {
            "p50": _pct(late, 50),
            "p99": _pct(late, 99),
            "max": float(late.max()) if late.size else None,
        },
        "ttft_ms": {
            q: _pct(done.get_column("ttft_ms").to_numpy(), float(q[1:]))
            for q in ("p50", "p95", "p99")
        },
        "itl_ms": {q: _pct(gaps, float(q[1:])) for q in ("p50", "p95", "p99")},
        "e2e_ms": {
            q: _pct(done.get_column("e2e_ms").to_numpy(), float(q[1:])) for q in ("p50", "p99")
        },
        "usage_reported": with_usage.height,
        "output_short": int(np.count_nonzero(got < asked)),
        "output_long": int(np.count_nonzero(got > asked)),
        "prompt_tokens_server_ratio": (
            float(prompt_usage.get_column("usage_prompt_tokens").sum()) / planned_prompt
            if planned_prompt
            else None
        ),
        **server_cache_hits(done),
    }


def server_cache_hits(done: pl.DataFrame) -> dict[str, Any]:
    """The server's own prefix-cache figure, where it reports one (``usage.prompt_tokens_details
    .cached_tokens``): cached ÷ prompt tokens over the answers that carry it, to set beside the
    replay's prediction. Unknown (None) when no answer carried it."""
    reported = done.filter(
        pl.col("usage_cached_tokens").is_not_null() & pl.col("usage_prompt_tokens").is_not_null()
    )
    prompt = int(reported.get_column("usage_prompt_tokens").sum())
    return {
        "cache_reported": reported.height,
        "cache_hit_share": (
            int(reported.get_column("usage_cached_tokens").sum()) / prompt if prompt else None
        ),
    }


def vllm_burstiness(arrivals: str, burstiness: float, arrival_cv: float) -> float:
    """vLLM's ``burstiness`` is the gamma shape k = 1 / CV² (1 = Poisson): the configured CV for
    gamma arrivals, the measured CV of the planned gaps for trace arrivals."""
    if arrivals == "poisson":
        return 1.0
    cv = burstiness if arrivals == "gamma" else arrival_cv
    return 1.0 / cv**2 if cv and math.isfinite(cv) and cv > 0 else 1.0


def vllm_result(
    requests: pl.DataFrame,
    *,
    model: str,
    api: str,
    rate_rps: float,
    burstiness: float,
    max_in_flight: int | None,
    started: dt.datetime,
) -> dict[str, Any]:
    """One rate's measured sends as a ``vllm bench serve --save-result`` JSON object (with its
    per-request arrays, as ``--save-detailed`` writes them; no generated text is kept)."""
    measured = requests.filter(~pl.col("warmup")).sort("index")
    done = measured.filter(pl.col("ok"))
    ttft_s = done.get_column("ttft_ms").to_numpy() / 1000.0
    e2e_s = done.get_column("e2e_ms").to_numpy() / 1000.0
    tpot_s = done.get_column("tpot_ms").drop_nulls().to_numpy() / 1000.0
    gaps = [np.asarray(g, dtype=np.float64) / 1000.0 for g in done.get_column("itl_ms").to_list()]
    itl_s = np.concatenate(gaps) if gaps else np.zeros(0)
    sent = measured.get_column("sent_s").drop_nulls()
    ends = (done.get_column("sent_s") + done.get_column("e2e_ms") / 1000.0).drop_nulls().to_numpy()
    first = float(sent.min()) if sent.len() else 0.0  # type: ignore[arg-type]
    last = float(ends.max()) if ends.size else first
    duration = max(last - first, 1e-9)
    input_tokens = done.select(pl.coalesce("usage_prompt_tokens", "prompt_tokens")).to_series()
    output_tokens = done.get_column("output_tokens")
    total_in, total_out = int(input_tokens.sum()), int(output_tokens.sum())
    endpoint = "openai-chat" if api == "chat" else "openai"
    offered = window_rate(measured.get_column("scheduled_s").to_numpy())
    out: dict[str, Any] = {
        "date": started.strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": endpoint,
        "backend": endpoint,
        "label": "enginefit-loadtest",
        "model_id": model,
        "tokenizer_id": model,
        "num_prompts": measured.height,
        # The rate the schedule offered during the measured sends, by the estimator the bench
        # stage applies to the actual send times: on schedule, the two agree exactly. A bursty
        # trace offers its target rate only over its whole pattern, not over every window.
        # Six significant digits: float noise in the offsets must not make two runs of one
        # schedule two different loads.
        "request_rate": float(f"{offered:.6g}") if offered is not None else rate_rps,
        "burstiness": burstiness,
        "max_concurrency": max_in_flight,
        "duration": duration,
        "completed": done.height,
        "failed": measured.height - done.height,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": done.height / duration,
        "request_goodput": None,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
        "max_concurrent_requests": peak_in_flight(done.get_column("sent_s").to_numpy(), ends),
    }
    for name, values in (("ttft", ttft_s), ("tpot", tpot_s), ("itl", itl_s), ("e2el", e2e_s)):
        for stat, value in _stats(values * 1000.0).items():
            out[f"{stat}_{name}_ms"] = value
    # Per-request arrays in vLLM's layout: failed requests hold 0 / [] and a non-empty error.
    ok = measured.get_column("ok").to_list()
    out["input_lens"] = (
        measured.select(pl.coalesce("usage_prompt_tokens", "prompt_tokens")).to_series().to_list()
    )
    out["output_lens"] = measured.get_column("output_tokens").fill_null(0).to_list()
    out["ttfts"] = (measured.get_column("ttft_ms").fill_null(0.0) / 1000.0).to_list()
    out["itls"] = [[g / 1000.0 for g in gap] for gap in measured.get_column("itl_ms").to_list()]
    out["latencies"] = (measured.get_column("e2e_ms").fill_null(0.0) / 1000.0).to_list()
    out["start_times"] = measured.get_column("sent_s").to_list()
    out["errors"] = [
        "" if good else f"{kind}: {detail}" if detail else str(kind)
        for good, kind, detail in zip(
            ok,
            measured.get_column("error_kind").to_list(),
            measured.get_column("error_detail").to_list(),
            strict=True,
        )
    ]
    return out


@dataclass(frozen=True)
class LoadtestInputs:
    """What a run replays: the first trace requests it can send, and what they are called."""

    trace: TraceSample
    label: str  # the configured workload's name, or the traces named ad hoc
    name: str | None  # the configured workload's name (the manifest's ``workload``)


def endpoint_url(endpoint: str, api: str) -> str:
    """The request URL for ``endpoint`` (a server root, its ``/v1``, or the full path)."""
    try:
        check_endpoint(endpoint)
    except ValueError as exc:
        raise ConfigError(f"--endpoint {endpoint!r}: {exc}") from exc
    parts = urlsplit(endpoint.strip())
    path = parts.path.rstrip("/")
    suffix = "/chat/completions" if api == "chat" else "/completions"
    if path.endswith(("/chat/completions", "/completions")):
        if not path.endswith(suffix) or (
            api == "completions" and path.endswith("/chat/completions")
        ):
            raise ConfigError(f"--endpoint {endpoint!r} is not the {api} API; pass the server root")
    elif path.endswith("/v1"):
        path += suffix
    else:
        path += "/v1" + suffix
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def public_url(url: str) -> str:
    """The URL without credentials or query (what the written files may name)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def plan_rates(trace: TraceSample, settings: LoadtestConfig) -> list[RatePlan]:
    return [
        plan_rate(
            trace,
            kind=settings.arrivals,
            rate_rps=rate,
            duration_s=settings.duration,
            warmup_s=settings.warmup,
            burstiness=settings.burstiness,
            seed=settings.seed,
        )
        for rate in settings.rates
    ]


def request_body(
    trace: TraceSample, plan: RatePlan, index: int, settings: LoadtestConfig, model: str
) -> bytes:
    """The JSON body of send ``index`` of ``plan``: the trace request's prompt, synthesised,
    and its output length, asked for as exactly as the server allows."""
    row = int(plan.trace_rows[index])
    words = prompt_words(
        trace.block_hashes(row),
        int(trace.prompt_tokens[row]),
        trace.block_size,
        plan.namespace,
        send_key=index,
    )
    text = prompt_text(words)
    output = int(trace.output_tokens[row])
    body: dict[str, Any] = {"model": model, "max_tokens": output, "stream": True}
    if settings.api == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    if settings.include_usage:
        body["stream_options"] = {"include_usage": True}
    if "ignore_eos" in settings.length_control:
        body["ignore_eos"] = True
    if "min_tokens" in settings.length_control:
        body["min_tokens"] = output
    return json.dumps(body, separators=(",", ":")).encode()


#: Bodies of one rate are encoded before it starts when they fit in this many bytes (about 8
#: bytes a prompt word), so no send waits for its own encoding; past it they are encoded one
#: send ahead, while the sender waits for the next send time.
PREBUILD_BYTES = 512 * 1024 * 1024


def bodies_for(
    trace: TraceSample, plan: RatePlan, settings: LoadtestConfig, model: str
) -> Callable[[int], bytes]:
    """Send ``i``'s body, encoded ahead of the run when the rate's bodies fit in memory."""
    words = int(trace.prompt_tokens[plan.trace_rows].sum())
    if words * 8 <= PREBUILD_BYTES:
        bodies = [request_body(trace, plan, i, settings, model) for i in range(plan.sends)]
        return bodies.__getitem__
    return lambda i: request_body(trace, plan, i, settings, model)
