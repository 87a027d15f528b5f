"""The capacity stage, shared by the ``workload_capacity`` asset and ``enginefit capacity``.

read → run → write:

* :func:`read_inputs` gathers what the core needs through the other stages' readers: the bench
  analysis (its evaluated load points; its SLO-capacity table, with the measured bracket and
  the benchmark's own $/1M output; the workload's mean and peak rate at ``bench.peak_window``;
  and the SLO and the prices it was made with) and its per-request rows (persisted by the bench
  stage as ``bench/per_request.parquet`` whenever a result file had them; the bundled sweep has
  none, so nothing there changes); the ingest table's ``prompt_tokens`` / ``output_tokens``; the
  cached share of prompt tokens from the simulation's scenarios
  (:func:`recommended_cached_share`); and what the team says of its model
  (:class:`~pipeline.capacity.config.ServedModel`): the replica's KV tokens
  (``requirements.kv_cache``, else the largest simulated cache) and the model's shape for the
  roofline prior.
* :func:`run` fits one serving model per benchmarked deployment (engine × GPU × model × version
  × GPU count, all of its sweeps together) from its kept-up open-loop points, and carries each
  to the workload's own mix (:mod:`pipeline.capacity.compute`).
* :func:`write` writes ``capacity/capacity.json`` (the document), ``candidates.parquet`` and
  ``model_errors.parquet``; :func:`read_result` reads the document back (what the decision
  reads). Paths: :class:`pipeline.layout.CapacityPaths`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from pipeline import results
from pipeline.bench import stage as bench_stage
from pipeline.bench.config import SloSpec
from pipeline.bench.result import BenchResult
from pipeline.capacity.compute import (
    WorkloadRequests,
    capacity_result,
    carry_to_workload,
    deployment_model_shape,
    workload_requests,
)
from pipeline.capacity.config import CapacityConfig, ServedModel
from pipeline.capacity.fit import deployment_of, fit_serving_model
from pipeline.capacity.limits import (
    SchedulingCatalog,
    SchedulingLimits,
    kv_bytes,
    resolve_limits,
    weight_bytes,
)
from pipeline.capacity.models import deployment_shape
from pipeline.capacity.prior import ModelShape
from pipeline.capacity.result import CapacityResult, Slo, candidates_frame, model_errors_frame
from pipeline.capacity.search import sample_requests
from pipeline.costing import Prices
from pipeline.errors import ConfigError, InputFormatError
from pipeline.layout import WorkloadLayout
from pipeline.safe_read import read_json
from pipeline.sim import stage as sim_stage
from pipeline.sim.result import ScenarioSummary
from pipeline.store import open_stage_output, read_requests, write_json_atomic, write_parquet_atomic
from pipeline.unknown import Unknown

STEP = results.Step(
    results.CAPACITY,
    upstream=(results.BENCH, results.LOAD_POINTS, results.REQUESTS, results.SCENARIOS),
    # decision: only its engine catalog (the engines' scheduling defaults).
    sections=("capacity", "requirements", "decision"),
)

#: The columns that name one benchmarked deployment (its sweeps are fitted together).
# The serving backend too: TensorRT-LLM's PyTorch and TensorRT backends are different servers.
DEPLOYMENT_KEYS = (
    "engine",
    "engine_version",
    "backend",
    "gpu_type",
    "gpu_count",
    "model",
    "label",
)
#: A load point's ``dataset`` when ``enginefit loadtest`` replayed a workload's own trace.
TRACE_DATASET = "enginefit-trace"
#: Largest cached share used (the core needs at least one uncached token per prompt).
MAX_CACHED_SHARE = 0.999


@dataclass(frozen=True)
class CapacityInputs:
    """What the capacity stage reads, gathered by :func:`read_inputs`."""

    workload: str
    points: pl.DataFrame  # the bench stage's evaluated load points
    per_request: pl.DataFrame | None
    bench_capacity: pl.DataFrame  # the bench stage's SLO capacity per candidate and sweep
    requests: pl.DataFrame  # prompt_tokens, output_tokens of the canonical table
    cached_share: float
    peak_rate_rps: float
    mean_rate_rps: float | None
    kv_tokens: int
    model_shape: ModelShape | None
    team_models: tuple[str, ...]  # requirements.models: whose shape model_shape is
    prices: Prices
    slo: Slo
    min_achieved_rate_share: float | None
    #: The engine catalog (its engines' scheduling defaults); None: no defaults.
    catalog: SchedulingCatalog | None = None
    sources: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def capacity_slo(spec: SloSpec) -> Slo:
    """``bench.slo`` as the limits the capacity search holds: p95 TTFT and p99 ITL (the
    configured ITL definition); a configuration without both is a one-line error."""
    limits = {limit.key: limit.max_ms for limit in spec.limits}
    missing = [key for key in ("ttft_p95_ms", "itl_p99_ms") if limits.get(key) is None]
    if missing:
        raise ConfigError(
            f"bench.slo: the capacity stage simulates p95 TTFT and p99 ITL; set "
            f"{' and '.join(missing)} (the SLO sets {', '.join(sorted(limits)) or 'no limit'})"
        )
    return Slo(
        ttft_p95_ms=limits["ttft_p95_ms"],
        itl_p99_ms=limits["itl_p99_ms"],
        itl_definition="per-request" if spec.itl_definition == "per-request" else "per-gap",
    )


def recommended_cached_share(
    summaries: Sequence[ScenarioSummary], kv_tokens: int, replicas: int | None = None
) -> tuple[float, str] | Unknown:
    """The share of prompt tokens the prefix cache serves under the recommended routing: among
    the simulated scenarios with a shared cache (isolated ones only when there are no others),
    at the replica count ``replicas`` (the largest simulated count not above it, else the
    smallest; None: the largest simulated), at the simulated cache size closest to the
    replica's KV tokens (by ratio), the routing with the highest hit ratio. Returns the share and
    a sentence saying which scenario it is; ``Unknown`` when no scenario has a known hit ratio.

    The decision calls this again with the fleet's own replica count."""
    known = [s for s in summaries if not isinstance(s.hit_ratio, Unknown)]
    if not known:
        return Unknown(reason="no simulated scenario has a known hit ratio")
    shared = [s for s in known if not s.tenant_isolation] or known
    counts = sorted({s.replicas for s in shared})
    if replicas is None:
        count = counts[-1]
    else:
        below = [c for c in counts if c <= replicas]
        count = below[-1] if below else counts[0]
    at_count = [s for s in shared if s.replicas == count]
    sizes = sorted({s.cache_tokens for s in at_count})
    size = min(sizes, key=lambda c: (abs(math.log(max(c, 1) / max(kv_tokens, 1))), c))
    candidates = [s for s in at_count if s.cache_tokens == size]
    best = max(candidates, key=lambda s: (float(s.hit_ratio), s.routing))  # type: ignore[arg-type]
    ratio = float(best.hit_ratio)  # type: ignore[arg-type]
    return (
        min(max(ratio, 0.0), MAX_CACHED_SHARE),
        f"{ratio:.1%} of prompt tokens cached: {best.routing} routing (the best simulated) at "
        f"{best.replicas} replica(s) with {best.cache_tokens:,}-token caches "
        f"(scenario {best.scenario})",
    )


def _kv_tokens(
    served: ServedModel, summaries: Sequence[ScenarioSummary], where: Path
) -> tuple[int, str]:
    """The KV-cache tokens of a replica: the team's (``requirements.kv_cache``), else the
    largest cache the simulation replayed (``where``: its summary, for the error)."""
    if served.kv_tokens is not None:
        tokens = served.kv_tokens
        return tokens, f"requirements.kv_cache: {tokens:,} tokens per replica"
    if not summaries:
        raise InputFormatError(
            f"{where}: no simulated scenario, so no cache size to take a replica's KV tokens "
            "from; set requirements.kv_cache (or simulation.cache_tokens, then `enginefit "
            "simulate`)"
        )
    largest = max(s.cache_tokens for s in summaries)
    return largest, (
        f"simulation.cache_tokens (the largest configured, {largest:,}); set "
        "requirements.kv_cache to size it from the hardware"
    )


def read_inputs(
    layout: WorkloadLayout, served: ServedModel, catalog: SchedulingCatalog | None
) -> CapacityInputs:
    """Everything :func:`run` needs, through the other stages' readers (the module docstring),
    with ``catalog`` the engine catalog ``decision.catalog`` names (its engines' scheduling
    defaults; None: none). A missing upstream output is the error naming the command that
    writes it."""
    return inputs_from(layout, bench_stage.read_analysis(layout), served, catalog)


def inputs_from(
    layout: WorkloadLayout,
    analysis: BenchResult,
    served: ServedModel,
    catalog: SchedulingCatalog | None,
) -> CapacityInputs:
    """:func:`read_inputs` with ``analysis`` the bench analysis the fleet is sized from: the
    written one, or one re-run in memory at another SLO (what-if)."""
    slo = capacity_slo(analysis.settings.slo)
    per_request = bench_stage.read_written_results(layout).per_request
    requests = read_requests(layout).select("prompt_tokens", "output_tokens").collect()
    require_output_lengths(requests, layout)
    rates = analysis.rates
    peak_label = next((k for k in rates if k.startswith("peak_")), None)
    mean = rates.get("mean")
    if peak_label is None and mean is None:
        raise InputFormatError(
            f"{layout.bench.analysis}: the bench analysis has no peak or mean rate of the "
            "workload (its arrivals have no times, or `enginefit bench` ran before `enginefit "
            "shape`); the capacity stage sizes the fleet from them"
        )
    notes: list[str] = []
    if peak_label is None:
        notes.append("no peak rate measured: the fleet is sized at the mean rate")
    peak = rates[peak_label] if peak_label is not None else float(mean)  # type: ignore[arg-type]
    summaries = sim_stage.read_summaries(layout)
    kv_tokens, kv_source = _kv_tokens(served, summaries, layout.simulation.summary)
    share = recommended_cached_share(summaries, kv_tokens)
    if isinstance(share, Unknown):
        notes.append(f"cached share taken as 0: {share.reason}")
        cached, cached_source = 0.0, f"none ({share.reason})"
    else:
        cached, cached_source = share
    sources = {
        "rates": f"shape stage: peak {peak:.4g} req/s ("
        + (peak_label.removeprefix("peak_") + " window" if peak_label else "mean")
        + ")"
        + (f", mean {mean:.4g} req/s" if mean is not None else ", mean unknown"),
        "kv_tokens": kv_source,
        "cached_share": cached_source,
        "model_shape": "requirements.kv_cache (the roofline prior of a deployment that served "
        "your model)"
        if served.shape is not None
        else "none: set requirements.kv_cache for the roofline prior",
    }
    return CapacityInputs(
        workload=layout.name,
        points=analysis.evaluated,
        per_request=per_request,
        bench_capacity=analysis.capacity,
        requests=requests,
        cached_share=cached,
        peak_rate_rps=peak,
        mean_rate_rps=mean,
        kv_tokens=kv_tokens,
        model_shape=served.shape,
        team_models=served.models,
        prices=analysis.settings.prices,
        slo=slo,
        min_achieved_rate_share=analysis.settings.slo.min_achieved_rate_share,
        catalog=catalog,
        sources=sources,
        notes=notes,
    )


def require_output_lengths(requests: pl.DataFrame, layout: WorkloadLayout) -> None:
    """The workload's own mix needs each request's output length: a trace that logs none (a
    column mapping with ``output_tokens: null``) leaves the capacity at its mix unknown, and
    says why rather than that the workload is empty."""
    logged = requests.filter(
        pl.col("prompt_tokens").is_not_null() & pl.col("output_tokens").is_not_null()
    ).height
    if requests.height and not logged:
        raise InputFormatError(
            f"{layout.ingest.requests}: none of the workload's {requests.height:,} requests logs "
            "an output length (a trace mapped with output_tokens: null), so its capacity at its "
            "own mix is unknown: map output_tokens to the column that logs it, or compare the "
            "engines on the benchmarks' own figures (`enginefit bench`)"
        )


def _column(frame: pl.DataFrame, name: str) -> pl.Expr:
    return pl.col(name) if name in frame.columns else pl.lit(None)


def fit_points(points: pl.DataFrame, min_achieved_rate_share: float | None) -> pl.DataFrame:
    """The load points a serving model is fitted from: open loop, judged to have kept up, and
    sent at the offered rate (achieved ≥ ``bench.slo.min_achieved_rate_share`` × offered when
    both are recorded: a client that fell behind did not offer the load the point claims)."""
    if points.is_empty():
        return points
    share = min_achieved_rate_share or 0.0
    offered, achieved = _column(points, "offered_rate_rps"), _column(points, "achieved_rate_rps")
    return points.filter(
        (_column(points, "load_mode") == "open")
        & (_column(points, "keep_up_status") == "kept_up")
        & (offered.is_null() | achieved.is_null() | (achieved >= offered * share))
    )


def _deployment_filter(frame: pl.DataFrame, key: dict[str, object]) -> pl.DataFrame:
    expr = pl.lit(True)
    for name, value in key.items():
        if name not in frame.columns:
            continue
        expr = expr & (pl.col(name).is_null() if value is None else pl.col(name) == value)
    return frame.filter(expr)


def run(inputs: CapacityInputs, settings: CapacityConfig) -> CapacityResult:
    """One candidate per benchmarked deployment, its serving model carried to the workload."""
    workload: WorkloadRequests = workload_requests(
        inputs.requests, cached_share=inputs.cached_share
    )
    points = inputs.points
    candidates = []
    notes = list(inputs.notes)
    keys = [k for k in DEPLOYMENT_KEYS if k in points.columns]
    groups = (
        points.select(keys).unique(maintain_order=True).sort(keys, nulls_last=True).to_dicts()
        if keys and not points.is_empty()
        else []
    )
    sample = (
        sample_requests(workload.prompt, workload.output, workload.cached, settings)
        if groups
        else None
    )
    for key in groups:
        rows = _deployment_filter(points, key)
        deployment = deployment_of(rows.row(0, named=True))
        usable = fit_points(rows, inputs.min_achieved_rate_share)
        bench_rows = _deployment_filter(inputs.bench_capacity, key)
        bench_candidates = sorted(
            {str(c) for c in _values(bench_rows, "candidate") if c is not None}
        )
        open_rows = (
            bench_rows.filter(pl.col("sweep") == "open")
            if "sweep" in bench_rows.columns
            else bench_rows
        )
        bracket = _bracket(open_rows)
        costs = _floats(bench_rows, "cost_per_1m_output_usd")
        manifest_prices = _floats(rows, "price_per_gpu_hour_usd")
        measured = not rows.filter(
            (_column(rows, "dataset") == TRACE_DATASET)
            & (_column(rows, "workload") == inputs.workload)
        ).is_empty()
        team_shape, shape_note = deployment_model_shape(
            inputs.model_shape, deployment.model, inputs.team_models
        )
        if shape_note is not None:
            notes.append(f"{deployment.describe()}: {shape_note}")
        limits = deployment_limits(rows, inputs.catalog, settings)
        quantization = next((str(q) for q in _values(rows, "quantization") if q), None)
        shape, shape_source = deployment_shape(
            team_shape,
            deployment.model,
            weight_bytes=weight_bytes(quantization),
            kv_bytes=kv_bytes(limits),
        )
        model = (
            fit_serving_model(
                usable,
                inputs.per_request,
                deployment,
                config=settings,
                limits=limits,
                model_shape=shape,
                shape_source=shape_source,
                measured_capacity=bracket,
                slo=inputs.slo,
            )
            if not usable.is_empty()
            else Unknown(
                reason=f"no kept-up open-loop load point sent at its offered rate for "
                f"{deployment.describe()}"
            )
        )
        candidate = carry_to_workload(
            deployment.describe(),
            model,
            workload,
            inputs.slo,
            kv_tokens=inputs.kv_tokens,
            gpu_hour_usd=inputs.prices.price_for(
                deployment.gpu_type, manifest_prices[0] if manifest_prices else None
            )[0],
            peak_rate_rps=inputs.peak_rate_rps,
            mean_rate_rps=inputs.mean_rate_rps,
            config=settings,
            deployment_gpus=deployment.gpu_count,
            measured_on_workload=measured,
            benchmark_cost_per_1m_output_usd=min(costs) if costs else None,
            sample=sample,
        )
        update: dict[str, object] = {"bench_candidates": bench_candidates}
        if team_shape is None and shape_note is not None:
            # Another model than the team's: whatever else, the figure is not yours.
            update["provisional_reason"] = "; ".join(
                r for r in (candidate.provisional_reason, shape_note) if r
            )
        candidates.append(candidate.model_copy(update=update))
    if not groups:
        notes.append("no benchmark load points: no deployment to carry to this workload")
    return capacity_result(
        inputs.workload,
        inputs.slo,
        workload,
        candidates,
        settings,
        peak_rate_rps=inputs.peak_rate_rps,
        mean_rate_rps=inputs.mean_rate_rps,
        sources=inputs.sources,
        notes=notes,
    )


def deployment_limits(
    rows: pl.DataFrame, catalog: SchedulingCatalog | None, settings: CapacityConfig
) -> SchedulingLimits:
    """The scheduling limits of the deployment whose load points are ``rows``: its manifest's
    ``engine_args``, what its result files record, the catalog's defaults for its engine and
    GPU, under the configuration's override (:func:`pipeline.capacity.limits.resolve_limits`)."""
    deployment = deployment_of(rows.row(0, named=True))
    manifest = next((str(m) for m in _values(rows, "manifest_file") if m), None)
    return resolve_limits(
        manifest_args=_json_column(rows, "engine_args"),
        recorded_args=_json_column(rows, "recorded_engine_args") or {},
        defaults=catalog.scheduling_defaults(deployment.engine, deployment.gpu_type)
        if catalog is not None
        else None,
        config=settings,
        manifest_file=manifest,
        gpu_count=deployment.gpu_count,
    )


def _json_column(frame: pl.DataFrame, column: str) -> dict[str, object] | None:
    """The JSON object of ``column`` with the most keys (the deployment's rows agree: one
    manifest), {} for an empty one, else None."""
    found: dict[str, object] | None = None
    for text in _values(frame, column):
        if text:
            value = json.loads(str(text))
            if isinstance(value, dict) and (found is None or len(value) > len(found)):
                found = value
    return found


def _values(frame: pl.DataFrame, column: str) -> list[object]:
    return frame.get_column(column).to_list() if column in frame.columns else []


def _floats(frame: pl.DataFrame, column: str) -> list[float]:
    """The column's known finite numbers (none when the column is absent)."""
    if column not in frame.columns:
        return []
    values = frame.get_column(column).cast(pl.Float64).drop_nulls().to_list()
    return [float(v) for v in values if math.isfinite(v)]


def _bracket(rows: pl.DataFrame) -> tuple[float, float | None] | None:
    """The sweep's measured SLO capacity (highest pass, first failure) for the model's check."""
    best: tuple[float, float | None] | None = None
    if "capacity_rps" not in rows.columns or "first_fail_load" not in rows.columns:
        return None
    for low, high in rows.select("capacity_rps", "first_fail_load").iter_rows():
        if low is None or not math.isfinite(low):
            continue
        pair = (float(low), None if high is None else float(high))
        if best is None or pair[0] > best[0]:
            best = pair
    return best


def write(result: CapacityResult, layout: WorkloadLayout) -> dict[str, Path]:
    """The document and its two tables, atomically."""
    open_stage_output(layout)
    paths = layout.capacity
    write_json_atomic(paths.result, result.to_json())
    write_parquet_atomic(candidates_frame(result), paths.candidates)
    write_parquet_atomic(model_errors_frame(result), paths.model_errors)
    written = {
        "result": paths.result,
        "candidates": paths.candidates,
        "model_errors": paths.model_errors,
    }
    results.CAPACITY.seal(layout, written.values())
    return written


def read_result(layout: WorkloadLayout) -> CapacityResult:
    """The capacity document written by :func:`write` (what the decision reads)."""
    path = results.CAPACITY.require(layout)
    return CapacityResult.from_json(read_json(path), str(path))
