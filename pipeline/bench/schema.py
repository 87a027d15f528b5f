"""The normalised benchmark table: one row per *load point* (one benchmark run at one load).

Every reader in :mod:`pipeline.bench.readers` turns a tool's result file into rows with exactly
these columns, in this order, with these dtypes (BENCH_FORMATS.md §8). Units are in the column
names; every latency is in milliseconds, every rate per second, whatever the tool wrote.

Public entry point (implemented in :mod:`pipeline.bench.readers`, re-exported by
:mod:`pipeline.bench`)::

    read_bench_files(paths, manifest=None) -> BenchReadResult(load_points, per_request, notes)

Columns of ``LOAD_POINT_SCHEMA``
--------------------------------
Lineage
  ``point_id``         ``"<tool>:<file name>#<record_index>"``; unique within one read.
  ``tool``             which tool wrote the file: ``vllm_bench_serve``, ``sglang_bench_serving``,
                       ``guidellm``, ``genai_perf``, ``aiperf``, ``llmperf``, ``inference_perf``.
  ``tool_version``     the tool's version when the file says it (guidellm, aiperf, llmperf
                       schema date), else the manifest's ``tool_version``, else null.
  ``source_schema``    the file layout generation, e.g. ``vllm-2025-early`` (``"request_goodput:"``
                       spelling, no ``failed``), ``vllm``, ``sglang-2024``, ``sglang-2025``,
                       ``sglang-late-2025``, ``sglang-refactor``, ``guidellm-G1`` … ``guidellm-G4``,
                       ``genai-perf``, ``aiperf-0.1``, ``aiperf-0.10``, ``llmperf-2023-08-31``,
                       ``inference-perf-stage``.
  ``source_file``      the result file path as given.
  ``source_sha256``    sha256 of the file's bytes.
  ``record_index``     0-based record inside the file: JSONL line number among non-blank lines
                       (vLLM ``--append-result``, SGLang), index in ``benchmarks[]`` (guidellm),
                       stage number N of ``stage_N_lifecycle_metrics.json`` (inference-perf),
                       0 for one-point files (genai-perf, aiperf, llmperf).
  ``manifest_file``    the sidecar manifest used (path), or ``"<explicit>"`` when passed in code.

System under test (from the sidecar manifest; see :mod:`pipeline.bench.manifest`)
  ``engine``, ``engine_version``, ``gpu_type``, ``gpu_count``, ``quantization``
                       Required: ``engine``, ``gpu_type``, ``gpu_count``. Files only carry hints
                       (vLLM ``--metadata``, SGLang ``server_info``); those go to ``file_metadata``.
  ``price_per_gpu_hour_usd``  $/GPU-hour from the manifest (null when not given).
  ``workload``         the manifest's workload label (null when not given).
  ``label``            what distinguishes runs of one engine/GPU in the same file (e.g. the
                       vLLM sample's ``deployment``): manifest ``label``, else the file value of
                       the manifest's ``label_from`` key, else the tool's own label (vLLM
                       ``label``, SGLang ``tag``, guidellm G4 labels), else null.
  ``model``            model name: manifest ``model`` overrides the file (vLLM ``model_id``,
                       guidellm backend model, genai-perf/aiperf ``input_config``, llmperf ``model``,
                       inference-perf ``config.yaml server.model_name``).
  ``client_protocol``  vLLM/SGLang ``backend`` / endpoint type — the *client* protocol, not the engine.
  ``dataset``          dataset name when the file says it (``random``, ``sharegpt`` …).
  ``run_date``         manifest ``run_date``, else the date in the file (vLLM ``date``, guidellm
                       start time, aiperf ``start_time``, llmperf ``timestamp``), else null.
  ``started_at``       run start when the file has an absolute time (UTC; vLLM's naive local
                       ``date`` is *not* converted and only feeds ``run_date``).

Load
  ``load_mode``        ``"open"`` (requests sent on a schedule, a rate), ``"closed"`` (a fixed
                       number of users each sending the next request when the last finishes: guidellm
                       ``synchronous``/``concurrent``, aiperf ``--concurrency N`` alone, recorded as
                       ``concurrency_burst``), or ``"offline"`` (everything sent at once: vLLM
                       ``"inf"``, SGLang ``Infinity``, guidellm ``throughput``).
  ``arrival_process``  finer detail: ``poisson``, ``gamma``, ``constant``, ``burst``,
                       ``concurrency``, ``synchronous``, ``ramp``, ``trace``, ``unknown``.
  ``offered_rate_rps`` target request rate. Null for closed loop; ``+inf`` for offline.
  ``achieved_rate_rps``  measured request *send* rate: inference-perf ``achieved_rate``, or
                       ``(n−1)/(last start − first start)`` from per-request start times; null
                       otherwise. Compare with ``offered_rate_rps`` to see whether the client
                       actually produced the load. (Completion rate is ``request_throughput_rps``.)
  ``burstiness``       vLLM gamma shape (1 = Poisson); null elsewhere.
  ``concurrency``      concurrency cap (open loop ``max_concurrency``) or the number of users
                       (closed loop); null when unbounded.
  ``mean_concurrency`` mean requests in flight when the tool reports it (SGLang ``concurrency``,
                       guidellm ``request_concurrency`` mean); null otherwise.

Counts and throughput
  ``num_requests``     requests sent (completed + failed + incomplete when known).
  ``completed``, ``failed``, ``incomplete``  request counts; ``failed`` null when the file cannot
                       tell (SGLang without ``errors``, genai-perf).
  ``error_rate``       ``failed / (completed + failed)``; null when ``failed`` is null.
  ``duration_s``, ``duration_kind``  benchmark duration and what it spans:
                       ``first_send_to_last_done`` (vLLM, SGLang, inference-perf),
                       ``measure_window`` (guidellm), ``first_req_to_last_resp`` (aiperf),
                       ``derived`` (count ÷ throughput), null when unknown.
  ``total_input_tokens``, ``total_output_tokens``  token totals over completed requests.
  ``output_tokens_source``  ``server_usage``, ``client_retokenized``, ``requested`` or ``unknown``.
  ``request_throughput_rps``  completed requests per second.
  ``input_tokens_per_s``, ``output_tokens_per_s``, ``total_tokens_per_s``  token throughput.
  ``goodput_rps``, ``goodput_slo``  the tool's own request goodput and its SLO text, when written.

Prompt / output lengths of the benchmark (over completed requests)
  ``input_tokens_mean``, ``input_tokens_p50``, ``input_tokens_p99``,
  ``output_tokens_mean``, ``output_tokens_p50``, ``output_tokens_p99``
  ``input_len_fixed``, ``output_len_fixed``  True when every request had the same length
                       (config says so, or min == max in the data), False when not, null unknown.
  ``input_len_target``, ``output_len_target``  configured (requested) lengths when the file says.

Latency metric families — each has ``<m>_mean_ms``, ``<m>_p50_ms``, ``<m>_p90_ms``,
``<m>_p95_ms``, ``<m>_p99_ms``, ``<m>_max_ms`` and ``<m>_source``:
  ``ttft``   time to first token, per request.
  ``tpot``   per-request decode time per token (see ``tpot_definition``), distribution over
             requests. This is what genai-perf/aiperf call ``inter_token_latency`` and what
             guidellm calls ``inter_token_latency_ms``.
  ``itl``    per-gap inter-token latency: one sample per gap between consecutive streamed
             chunks/tokens, pooled over all requests (vLLM/SGLang ``itl``, aiperf
             ``inter_chunk_latency``, inference-perf ``inter_token_latency``). Never filled from
             a per-request mean.
  ``e2e``    end-to-end request latency.
  ``<m>_source`` is ``"recomputed"`` (all six stats computed by
  :func:`pipeline.bench.percentiles.latency_stats` from per-request data in the same file or
  artifact dir — one method, numpy ``linear`` percentiles, for every tool), ``"native"`` (taken
  from the tool's aggregates), or ``"missing"`` (no stat available). A null stat is missing
  whatever the flag says (e.g. a native vLLM file with only ``p99``: ``ttft_p95_ms`` is null) —
  never interpolated from other percentiles.
  ``tpot_definition``  ``decode_per_request`` = ``(e2e − ttft)/(out − 1)`` per request,
                       request-weighted (vLLM, SGLang, genai-perf, aiperf, inference-perf,
                       llmperf recomputed); ``decode_token_weighted`` = guidellm's
                       ``inter_token_latency_ms`` (same per request, token-weighted stats).
  ``itl_definition``   ``per_gap_pooled`` when the ``itl`` family has any value, else null.
  ``native_stats``     JSON object (sorted keys) of the tool's own aggregates under normalised
                       names (``ttft_p99_ms`` …, plus tool-only figures such as llmperf's
                       ``llmperf_inter_token_latency_ms_mean``) — kept for cross-checks when a
                       family is recomputed.
  ``percentile_method``  ``numpy-linear`` for recomputed families, ``tool`` otherwise.

Misc
  ``has_per_request``  True when per-request rows for this point are in ``per_request``.
  ``file_metadata``    JSON object (sorted keys) of hints the file carried, from an allowlist
                       per tool (a result file may carry prompts, so nothing else is kept):
                       vLLM ``--metadata`` keys ``vllm.METADATA_KEYS`` (``gpu``, ``deployment``,
                       ``gateway``, ``decode_replicas``, ``prefill_replicas``, ``input_len``,
                       ``output_len``, ``model``), llmperf ``llmperf.METADATA_KEYS``
                       (``framework``, ``model_size``), each only as a short scalar (≤ 200
                       characters); guidellm ``strategy``, ``labels`` and G2 ``data`` (the
                       dataset id or synthetic config); SGLang ``server_info.version``; aiperf
                       ``telemetry_gpu_names``; genai-perf ``input_config.endpoint.backend`` and
                       ``telemetry_stats`` (names); inference-perf ``config.server.type`` and
                       ``config.server.ignore_eos``. Other free-form keys are dropped with a
                       note counting them; the manifest's ``label_from`` still reads them.
  ``row_notes``        warnings about this point (e.g. achieved rate below offered, request list
                       longer than the measured window).
  ``rejected_values``  measured values that are NaN (not measured) or that no run can produce (a
                       negative or infinite latency, throughput, rate, duration, count or
                       length; an error rate above 1), as ``"<column> = <value> is <why>"``: each
                       was set to null (unknown), so it can neither pass an SLO nor feed a cost
                       (:func:`screen_measurements`); a point with an impossible one is not
                       judged at all.

``PER_REQUEST_SCHEMA`` (one row per request, when the file has per-request data)
  ``point_id``, ``source_file``, ``record_index``, ``request_index`` (0-based within the point),
  ``ok`` (False for failed requests), ``start_s`` (seconds from the point's first send; null when
  unknown), ``ttft_ms``, ``e2e_ms``, ``tpot_ms``, ``itl_ms`` (list of per-gap ms), ``input_tokens``,
  ``output_tokens``, ``error`` (the tool's error string, truncated to 200 characters; prompt and
  generated text are never kept).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

LATENCY_METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2e")
LATENCY_STATS: tuple[str, ...] = ("mean", "p50", "p90", "p95", "p99", "max")
# percentile name -> q in [0, 1]
PERCENTILES: dict[str, float] = {"p50": 0.50, "p90": 0.90, "p95": 0.95, "p99": 0.99}


def _latency_columns() -> dict[str, pl.DataType]:
    cols: dict[str, pl.DataType] = {}
    for metric in LATENCY_METRICS:
        for stat in LATENCY_STATS:
            cols[f"{metric}_{stat}_ms"] = pl.Float64()
        cols[f"{metric}_source"] = pl.String()
    return cols


LOAD_POINT_SCHEMA: pl.Schema = pl.Schema(
    {
        # lineage
        "point_id": pl.String(),
        "tool": pl.String(),
        "tool_version": pl.String(),
        "source_schema": pl.String(),
        "source_file": pl.String(),
        "source_sha256": pl.String(),
        "record_index": pl.Int64(),
        "manifest_file": pl.String(),
        # system under test
        "engine": pl.String(),
        "engine_version": pl.String(),
        "gpu_type": pl.String(),
        "gpu_count": pl.Int64(),
        "quantization": pl.String(),
        "price_per_gpu_hour_usd": pl.Float64(),
        "workload": pl.String(),
        "label": pl.String(),
        "model": pl.String(),
        "client_protocol": pl.String(),
        "dataset": pl.String(),
        "run_date": pl.Date(),
        "started_at": pl.Datetime("us", "UTC"),
        # load
        "load_mode": pl.String(),
        "arrival_process": pl.String(),
        "offered_rate_rps": pl.Float64(),
        "achieved_rate_rps": pl.Float64(),
        "burstiness": pl.Float64(),
        "concurrency": pl.Int64(),
        "mean_concurrency": pl.Float64(),
        # counts and throughput
        "num_requests": pl.Int64(),
        "completed": pl.Int64(),
        "failed": pl.Int64(),
        "incomplete": pl.Int64(),
        "error_rate": pl.Float64(),
        "duration_s": pl.Float64(),
        "duration_kind": pl.String(),
        "total_input_tokens": pl.Int64(),
        "total_output_tokens": pl.Int64(),
        "output_tokens_source": pl.String(),
        "request_throughput_rps": pl.Float64(),
        "input_tokens_per_s": pl.Float64(),
        "output_tokens_per_s": pl.Float64(),
        "total_tokens_per_s": pl.Float64(),
        "goodput_rps": pl.Float64(),
        "goodput_slo": pl.String(),
        # prompt / output lengths
        "input_tokens_mean": pl.Float64(),
        "input_tokens_p50": pl.Float64(),
        "input_tokens_p99": pl.Float64(),
        "output_tokens_mean": pl.Float64(),
        "output_tokens_p50": pl.Float64(),
        "output_tokens_p99": pl.Float64(),
        "input_len_fixed": pl.Boolean(),
        "output_len_fixed": pl.Boolean(),
        "input_len_target": pl.Int64(),
        "output_len_target": pl.Int64(),
        # latency families
        **_latency_columns(),
        "tpot_definition": pl.String(),
        "itl_definition": pl.String(),
        "native_stats": pl.String(),
        "percentile_method": pl.String(),
        # misc
        "has_per_request": pl.Boolean(),
        "file_metadata": pl.String(),
        "row_notes": pl.List(pl.String()),
        "rejected_values": pl.List(pl.String()),
    }
)

PER_REQUEST_SCHEMA: pl.Schema = pl.Schema(
    {
        "point_id": pl.String(),
        "source_file": pl.String(),
        "record_index": pl.Int64(),
        "request_index": pl.Int64(),
        "ok": pl.Boolean(),
        "start_s": pl.Float64(),
        "ttft_ms": pl.Float64(),
        "e2e_ms": pl.Float64(),
        "tpot_ms": pl.Float64(),
        "itl_ms": pl.List(pl.Float64()),
        "input_tokens": pl.Int64(),
        "output_tokens": pl.Int64(),
        "error": pl.String(),
    }
)


@dataclass(frozen=True)
class BenchReadResult:
    """What :func:`pipeline.bench.read_bench_files` returns.

    ``load_points`` has ``LOAD_POINT_SCHEMA`` and is sorted by (``source_file``,
    ``record_index``). ``per_request`` has ``PER_REQUEST_SCHEMA`` (sorted by ``point_id``,
    ``request_index``) or is None when no file had per-request data. ``notes`` are
    human-readable remarks about the read (files detected as cross-stage summaries and skipped,
    recomputations, mismatches), in input order.
    """

    load_points: pl.DataFrame
    per_request: pl.DataFrame | None
    notes: list[str] = field(default_factory=list)


def conform_load_points(frame: pl.DataFrame) -> pl.DataFrame:
    """Add any missing column as nulls, cast to ``LOAD_POINT_SCHEMA`` and put it in order."""
    missing = [
        pl.lit(None, dtype=dtype).alias(name)
        for name, dtype in LOAD_POINT_SCHEMA.items()
        if name not in frame.columns
    ]
    return frame.with_columns(missing).select(
        pl.col(name).cast(dtype) for name, dtype in LOAD_POINT_SCHEMA.items()
    )


def conform_per_request(frame: pl.DataFrame) -> pl.DataFrame:
    """Add any missing column as nulls, cast to ``PER_REQUEST_SCHEMA`` and put it in order."""
    missing = [
        pl.lit(None, dtype=dtype).alias(name)
        for name, dtype in PER_REQUEST_SCHEMA.items()
        if name not in frame.columns
    ]
    return frame.with_columns(missing).select(
        pl.col(name).cast(dtype) for name, dtype in PER_REQUEST_SCHEMA.items()
    )


#: Measured columns that no run can make negative, NaN or infinite (``offered_rate_rps`` may
#: be +inf: everything sent at once); ``error_rate`` must also be at most 1.
NON_NEGATIVE_COLUMNS: tuple[str, ...] = (
    *(f"{m}_{s}_ms" for m in LATENCY_METRICS for s in LATENCY_STATS),
    "offered_rate_rps",
    "achieved_rate_rps",
    "burstiness",
    "concurrency",
    "mean_concurrency",
    "num_requests",
    "completed",
    "failed",
    "incomplete",
    "error_rate",
    "duration_s",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput_rps",
    "input_tokens_per_s",
    "output_tokens_per_s",
    "total_tokens_per_s",
    "goodput_rps",
    *(f"{side}_tokens_{s}" for side in ("input", "output") for s in ("mean", "p50", "p99")),
    "input_len_target",
    "output_len_target",
)


#: Why a NaN is listed: a value the tool did not measure, not an impossible one.
NOT_A_NUMBER = "not a number"


def _problem(column: str) -> pl.Expr:
    """Why ``column``'s value is impossible (null when it is fine or unknown)."""
    x = pl.col(column).cast(pl.Float64)
    why = pl.when(x.is_nan()).then(pl.lit(NOT_A_NUMBER)).when(x < 0).then(pl.lit("negative"))
    if column != "offered_rate_rps":
        why = why.when(x.is_infinite()).then(pl.lit("infinite"))
    if column == "error_rate":
        why = why.when(x > 1).then(pl.lit("above 1"))
    return why.otherwise(None)


def screen_measurements(points: pl.DataFrame) -> pl.DataFrame:
    """Impossible measured values (:data:`NON_NEGATIVE_COLUMNS`) set to null and each listed in
    ``rejected_values`` (added to what an earlier screen listed; screening twice changes
    nothing)."""
    problems = {c: _problem(c) for c in NON_NEGATIVE_COLUMNS if c in points.columns}
    entries = [
        pl.when(why.is_not_null()).then(pl.format(f"{c} = {{}} is {{}}", pl.col(c), why))
        for c, why in problems.items()
    ]
    earlier = (
        pl.col("rejected_values").fill_null([])
        if "rejected_values" in points.columns
        else pl.lit([], dtype=pl.List(pl.String()))
    )
    return points.with_columns(
        rejected_values=pl.concat_list([earlier, *entries]).list.drop_nulls(),
        **{c: pl.when(why.is_null()).then(pl.col(c)) for c, why in problems.items()},
    )


def impossible_values(frame: pl.DataFrame) -> pl.Expr:
    """``rejected_values`` without the NaNs: a NaN is a value the tool did not measure (treated
    as missing), the others are values no run can produce, which leave the record untrusted."""
    if "rejected_values" not in frame.columns:
        return pl.lit([], dtype=pl.List(pl.String()))
    entries = pl.col("rejected_values").fill_null([])
    return entries.list.eval(
        pl.element().filter(~pl.element().str.ends_with(f" is {NOT_A_NUMBER}"))
    )


def rejected_notes(points: pl.DataFrame) -> list[str]:
    """One note per screened point, naming its file (in the point id) and the values."""
    return [
        f"{point_id}: {'; '.join(values)}: not a possible measurement, treated as unknown"
        for point_id, values in points.select("point_id", "rejected_values").iter_rows()
        if values
    ]


def empty_load_points() -> pl.DataFrame:
    return pl.DataFrame(schema=LOAD_POINT_SCHEMA)
