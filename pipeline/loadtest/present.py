"""A load test for a person: the plan before it runs, each rate's line, the closing summary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pipeline.loadtest.plan import RatePlan, TraceSample
from pipeline.present.tables import cell, text_table

#: Fewer distinct arrival instants than this share of the replayed requests: bucketed timestamps.
BUCKETED_SHARE = 0.5
#: Send lateness (p99, ms) the client is measured to keep at 500 req/s (README, make bench).
LATE_MS = 5.0


def plan_lines(trace: TraceSample, plans: Sequence[RatePlan], settings: Any) -> list[str]:
    """What will be sent: per rate, how many requests, over how long, with which arrivals."""
    prompts, outputs = trace.prompt_tokens, trace.output_tokens
    shared = "none (the trace has no content)"
    if trace.hashes_known:
        blocks = np.diff(trace.hash_offsets)
        shared = f"{int(blocks.sum()):,} hashed prompt blocks of {trace.block_size} tokens"
    lines = [
        f"trace: {trace.requests:,} requests loaded; prompt tokens p50 {np.median(prompts):g}, "
        f"max {prompts.max():,}; output tokens p50 {np.median(outputs):g}, max {outputs.max():,}; "
        f"prefix structure: {shared}",
    ]
    if trace.output_filled:
        lines.append(
            f"  {trace.output_filled:,} requests log no output length: they ask for the median, "
            f"{int(np.median(outputs))} tokens"
        )
    if len(trace.served_as) > 1:
        lines.append(
            f"  the trace was served as {len(trace.served_as)} models/adapters "
            f"({', '.join(trace.served_as[:4])}{' …' if len(trace.served_as) > 4 else ''}): "
            "every request goes to --model, so their separate caches become one"
        )
    for p in plans:
        rows_replayed = int(np.unique(p.trace_rows).size)
        if p.trace_instants is not None and p.trace_instants < BUCKETED_SHARE * rows_replayed:
            lines.append(
                f"  warning: at {p.rate_rps:g} req/s the {rows_replayed:,} replayed requests "
                f"arrive at only {p.trace_instants:,} distinct instant(s) (the trace's timestamps "
                "are bucketed): trace arrivals send each bucket as one burst; consider "
                "--arrivals poisson, or --arrivals gamma --burstiness CV"
            )
    rows = [
        [
            f"{p.rate_rps:g}",
            f"{p.sends:,}",
            f"{p.warmup_count:,}",
            f"{p.offsets_s[-1]:.1f}" if p.sends else "0",
            cell(p.arrival_cv, 2),
        ]
        for p in plans
    ]
    lines.append(f"plan ({settings.arrivals} arrivals, {settings.api} API):")
    lines += text_table(rows, ["req/s", "sends", "warm-up", "last send s", "gap CV"])
    return lines


def plan_problems(plans: Sequence[RatePlan]) -> list[str]:
    """What makes a plan unable to measure anything: a rate whose sends all fall in warm-up."""
    return [
        f"--rates {p.rate_rps:g}: all {p.sends:,} planned sends fall in the warm-up, so nothing "
        "would be measured; lengthen --duration (or shorten --warmup)"
        for p in plans
        if p.sends - p.warmup_count <= 0
    ]


def _ms(values: Mapping[str, Any], key: str) -> str:
    return cell(values.get(key), 3)


def rate_line(summary: Mapping[str, Any]) -> str:
    """One rate, one line: sent on time, completed, failures, latency."""
    errors = ", ".join(f"{k} {v}" for k, v in summary["errors"].items()) or "none"
    return (
        f"{summary['rate_rps']:g} req/s: {summary['sent']:,}/{summary['measured']:,} sent "
        f"(p99 {_ms(summary['late_ms'], 'p99')} ms late), {summary['completed']:,} completed, "
        f"failed: {errors}; TTFT p95 {_ms(summary['ttft_ms'], 'p95')} ms, "
        f"ITL p99 {_ms(summary['itl_ms'], 'p99')} ms"
        + (" (interrupted)" if summary["interrupted"] else "")
    )


def summary_lines(record: Mapping[str, Any]) -> list[str]:
    """The closing table and what deserves a second look."""
    rates = record["rates"]
    rows = [
        [
            f"{s['rate_rps']:g}",
            cell(s["offered_rate_rps"], 3),
            cell(s["achieved_send_rate_rps"], 3),
            _ms(s["late_ms"], "p99"),
            f"{s['completed']:,}/{s['measured']:,}",
            ", ".join(f"{k} {v}" for k, v in s["errors"].items()) or "none",
            _ms(s["ttft_ms"], "p95"),
            _ms(s["itl_ms"], "p99"),
            _ms(s["e2e_ms"], "p99"),
        ]
        for s in rates
    ]
    lines = [
        "summary (warm-up excluded; times in ms; offered/s and sent/s: (n − 1) ÷ (last − first) "
        "of the measured sends, planned and actual):"
    ]
    lines += text_table(
        rows,
        [
            "req/s",
            "offered/s",
            "sent/s",
            "late p99",
            "completed",
            "failed",
            "TTFT p95",
            "ITL p99",
            "e2e p99",
        ],
    )
    for s in rates:
        lines += [f"  {s['rate_rps']:g} req/s: {note}" for note in rate_notes(s)]
    return lines


def rate_notes(summary: Mapping[str, Any]) -> list[str]:
    """What a rate's numbers warn about: missing usage, answers of the wrong length, a send
    schedule the client could not keep, a prompt the server counts differently."""
    notes: list[str] = []
    done = summary["completed"]
    if done and summary["usage_reported"] < done:
        notes.append(
            f"{done - summary['usage_reported']:,} of {done:,} answers carried no usage: their "
            "output tokens are counted as content chunks (exact only at one token per chunk)"
        )
    if summary["output_short"]:
        notes.append(
            f"{summary['output_short']:,} answers were shorter than the trace asked (max_tokens): "
            "the server stopped early (it ignores ignore_eos/min_tokens, or hit a limit); output "
            "lengths then differ from the trace"
        )
    if summary.get("cache_hit_share") is not None:
        notes.append(
            f"the server reported {summary['cache_hit_share']:.1%} of prompt tokens served from "
            f"its prefix cache ({summary['cache_reported']:,} answers; `enginefit simulate` "
            "predicts the same figure for a cache of its size)"
        )
    cut = summary["errors"].get("cut_stream", 0) + summary["errors"].get("cut_stream_silent", 0)
    if cut:
        notes.append(
            f"{cut:,} answers ended early (cut streams): a prompt longer than the server's "
            "context window, a crash, a proxy timeout or (llama-cpp-python) interrupt_requests; "
            "the server's log says which"
        )
    if summary["output_long"]:
        notes.append(f"{summary['output_long']:,} answers were longer than max_tokens")
    offered = summary.get("offered_rate_rps")
    if offered is not None and abs(offered / summary["rate_rps"] - 1.0) > 0.1:
        notes.append(
            f"the schedule offered {offered:.3g} req/s during the measured sends, not "
            f"{summary['rate_rps']:g} (arrival bursts; a longer --duration evens them out): "
            "the result file and the bench stage use the rate offered"
        )
    late = summary["late_ms"].get("p99")
    ttft = summary["ttft_ms"].get("p50") or 0.0
    # Late sends matter against the latencies measured: 5 ms (the client's own target) or a
    # twentieth of the median time to first token, whichever is larger.
    if late is not None and late > max(LATE_MS, 0.05 * ttft):
        notes.append(
            f"sends were up to {late:.3g} ms late at p99: the client (or its cap) could not keep "
            "the schedule; the achieved send rate is what the bench stage judges"
        )
    ratio = summary.get("prompt_tokens_server_ratio")
    if ratio is not None and abs(ratio - 1.0) > 0.05:
        notes.append(
            f"the server counted {ratio:.3g}× the planned prompt tokens (its tokenizer or chat "
            "template differs from one token per word)"
        )
    return notes


def nothing_completed(record: Mapping[str, Any]) -> str:
    """Why a run measured nothing: the commonest failure, and what to try for it."""
    kinds: dict[str, int] = {}
    for summary in record["rates"]:
        for kind, count in summary["errors"].items():
            kinds[kind] = kinds.get(kind, 0) + count
    if not kinds:
        return "nothing was sent"
    kind, count = max(kinds.items(), key=lambda item: (item[1], item[0]))
    advice = {
        "http_400": "the server refused the request: if it rejects ignore_eos/min_tokens, "
        "pass --length-control ''",
        "http_422": "the server refused the request: if it rejects ignore_eos/min_tokens, "
        "pass --length-control ''",
        "http_404": "check --model (the name GET /v1/models lists) and --api",
        "http_401": "check the token in $OPENAI_API_KEY (or --api-key-env)",
        "connect_error": "check --endpoint and that the server is up",
        "timeout": "the server never answered in time: check it, or raise --read-timeout",
    }.get(kind, "see error_kind and error_detail in loadtest-requests.parquet")
    return f"{count:,} requests failed as {kind}: {advice}"
