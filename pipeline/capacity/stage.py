"""The capacity stage, shared by the ``workload_capacity`` asset and ``enginefit capacity``.

read → run → write:

* :func:`read_inputs` gathers what the core needs through the other stages' readers: the bench
  analysis (its evaluated load points; its SLO-capacity table, with the measured bracket and
  the benchmark's own $/1M output; the workload's mean and peak rate at ``bench.peak_window``;
  and the SLO and the prices it was made with) and its per-request rows (persisted by the bench
  stage as ``bench/per_request.parquet`` whenever a result file had them; the bundled sweep has
  none, so nothing there changes); the ingest table's ``prompt_tokens`` / ``output_tokens`` /
  ``arrival``; the arrival pattern the shape stage measured (the search replays it:
  :func:`arrival_pattern`); the workload flattened for the simulation's replay kernels and its
  scenarios, from which each candidate's fleet cache is replayed
  (:class:`pipeline.capacity.fleet_cache.CacheReplays`, with the ``simulation`` section's
  settings: :class:`~pipeline.capacity.config.ReplayBasis`); and what the team says of
  its model (:class:`~pipeline.capacity.config.ServedModel`): the replica's KV tokens
  (``requirements.kv_cache``, else the largest simulated cache; each deployment's own pool is
  sized from its GPUs), the model's shape for the roofline prior and the GPU memory.
* :func:`run` fits one serving model per benchmarked deployment (engine × GPU × model × version
  × GPU count, all of its sweeps together) from its kept-up open-loop points, and carries each
  to the workload's own mix (:mod:`pipeline.capacity.compute`); where the workload's own
  traffic was load-tested, it also sets the capacity a model fitted on the deployment's other
  sweeps predicts against the one measured (``prediction_check``).
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

import numpy as np
import polars as pl

from pipeline import results
from pipeline.arrays import narrow
from pipeline.bench import stage as bench_stage
from pipeline.bench.config import SloSpec
from pipeline.bench.manifest import TRACE_DATASET
from pipeline.bench.result import BenchResult
from pipeline.capacity.compute import (
    WorkloadRequests,
    capacity_result,
    carry_to_workload,
    deployment_model_shape,
    predicted_capacity,
    prediction_check,
    workload_requests,
)
from pipeline.capacity.config import CapacityConfig, ReplayBasis, ServedModel
from pipeline.capacity.fit import deployment_of, fit_serving_model
from pipeline.capacity.fleet_cache import CacheReplays, deployment_kv_tokens
from pipeline.capacity.limits import (
    SchedulingCatalog,
    SchedulingLimits,
    kv_bytes,
    resolve_limits,
    weight_bytes,
)
from pipeline.capacity.models import deployment_shape
from pipeline.capacity.prior import ModelShape
from pipeline.capacity.result import (
    Arrivals,
    CapacityResult,
    PredictionCheck,
    ServingModel,
    Slo,
    candidates_frame,
    model_errors_frame,
)
from pipeline.capacity.search import POISSON, RequestSample, sample_requests
from pipeline.costing import Prices
from pipeline.errors import ConfigError, InputFormatError
from pipeline.layout import WorkloadLayout
from pipeline.safe_read import read_json
from pipeline.shape import stage as shape_stage
from pipeline.shape.result import Arrivals as ShapeArrivals
from pipeline.sim import stage as sim_stage
from pipeline.sim.result import ScenarioSummary
from pipeline.sim.resume import DailyStream
from pipeline.store import open_stage_output, read_requests, write_json_atomic, write_parquet_atomic
from pipeline.unknown import Unknown

STEP = results.Step(
    results.CAPACITY,
    upstream=(
        results.BENCH,
        results.LOAD_POINTS,
        results.REQUESTS,
        results.SHAPE,
        results.SCENARIOS,
    ),
    # decision: only its engine catalog (the engines' scheduling defaults); simulation and
    # shape: how the fleet's cache is replayed (ReplayBasis).
    sections=("capacity", "requirements", "decision", "simulation", "shape"),
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


@dataclass(frozen=True)
class CapacityInputs:
    """What the capacity stage reads, gathered by :func:`read_inputs`."""

    workload: str
    points: pl.DataFrame  # the bench stage's evaluated load points
    per_request: pl.DataFrame | None
    bench_capacity: pl.DataFrame  # the bench stage's SLO capacity per candidate and sweep
    # The requests with both lengths, in arrival order (their arrays, not the table: at 100M
    # requests the table beside them was another 1.6 GB), and the table's rows with or without.
    requests: WorkloadRequests
    table_rows: int
    peak_rate_rps: float
    mean_rate_rps: float | None
    kv_tokens: int
    # --- the traffic's own arrivals and the fleet's own cache ---
    measured_arrivals: ShapeArrivals  # the shape stage's (the search's pattern: run's settings)
    cache: CacheReplays | Unknown  # Unknown: the workload's requests come uncached
    served: ServedModel  # its memory sizes each deployment's KV pool
    # ---
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


def arrival_pattern(measured: ShapeArrivals, settings: CapacityConfig, requests: int) -> Arrivals:
    """How the search's requests arrive (``capacity.arrivals``), from what the shape stage
    measured: the inter-arrival CV when the timestamps resolve gaps, else the CV the smallest
    supported count window implies (a renewal process's index of dispersion tends to CV² over
    windows much longer than a gap). ``trace`` falls back to Gamma at that CV when the gaps are
    not resolved, and to Poisson when neither is known; ``gamma`` takes ``arrival_cv`` first."""
    gaps = measured.inter_arrival
    gap_cv = None if isinstance(gaps, Unknown) else gaps.get("cv")
    counted = sorted(
        (w.window_s, w.index_of_dispersion)
        for w in measured.windows.values()
        if not isinstance(w, Unknown) and w.index_of_dispersion is not None
    )
    count_cv = (
        (
            math.sqrt(counted[0][1]),
            f"from the {counted[0][0]} s window counts' index of dispersion {counted[0][1]:.2f}",
        )
        if counted
        else None
    )
    not_gaps = gaps.reason if isinstance(gaps, Unknown) else "the gaps' CV is not known"
    if settings.arrivals == "poisson":
        return POISSON
    if settings.arrivals == "gamma" and settings.arrival_cv is not None:
        cv = settings.arrival_cv
        return Arrivals(
            kind="gamma", cv=cv, description=f"Gamma arrivals at CV {cv:g} (configured)"
        )
    if settings.arrivals == "trace" and gap_cv is not None:
        take = min(requests, settings.sample_requests)
        runs = 1 if take >= requests else min(settings.arrival_windows, take)
        shape = (
            "the whole trace in order"
            if runs == 1
            else f"{runs} contiguous runs of about {take // runs:,} requests spread over the trace"
        )
        return Arrivals(
            kind="trace",
            cv=float(gap_cv),
            description=f"the workload's own arrivals: {shape}, each scaled to the rate tried "
            f"(the whole trace's inter-arrival CV {gap_cv:.2f}, its rate's changes included)",
        )
    if gap_cv is not None:
        return Arrivals(
            kind="gamma",
            cv=float(gap_cv),
            description=f"Gamma arrivals at the measured inter-arrival CV {gap_cv:.2f}",
        )
    if count_cv is not None:
        cv, whence = count_cv
        return Arrivals(
            kind="gamma",
            cv=cv,
            description=f"Gamma arrivals at CV {cv:.2f} {whence} ({not_gaps})",
        )
    return POISSON.model_copy(
        update={
            "description": f"Poisson arrivals: the workload's burstiness is not known ({not_gaps}; "
            "no count window supported)"
        }
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
    layout: WorkloadLayout,
    served: ServedModel,
    catalog: SchedulingCatalog | None,
    replay: ReplayBasis,
) -> CapacityInputs:
    """Everything :func:`run` needs, through the other stages' readers (the module docstring),
    with ``catalog`` the engine catalog ``decision.catalog`` names (its engines' scheduling
    defaults; None: none) and ``replay`` how the fleet's cache is replayed. A missing upstream
    output is the error naming the command that writes it."""
    return inputs_from(layout, bench_stage.read_analysis(layout), served, catalog, replay)


def inputs_from(
    layout: WorkloadLayout,
    analysis: BenchResult,
    served: ServedModel,
    catalog: SchedulingCatalog | None,
    replay: ReplayBasis,
    *,
    keep_passes: bool = True,
) -> CapacityInputs:
    """:func:`read_inputs` with ``analysis`` the bench analysis the fleet is sized from: the
    written one, or one re-run in memory at another SLO (a what-if: ``keep_passes`` False,
    so its fleet replays read the stage's kept passes back but keep none)."""
    slo = capacity_slo(analysis.settings.slo)
    per_request = bench_stage.read_written_results(layout).per_request
    requests = read_requests(layout).select("prompt_tokens", "output_tokens", "arrival").collect()
    # The simulation's order (pipeline.sim.blocks.sim_input): the replays' hits line up. Ingest
    # writes the table in that order, so the (stable) sort, a copy of every column, is mostly
    # not needed.
    if not requests.get_column("arrival").is_sorted(nulls_last=True):
        requests = requests.sort("arrival", nulls_last=True, maintain_order=True)
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
    workload = workload_requests(requests)
    cache = _cache_replays(layout, replay, summaries, requests, workload, keep_passes)
    if isinstance(cache, Unknown):
        notes.append(f"cached tokens taken as 0: {cache.reason}")
    sources = {
        "rates": f"shape stage: peak {peak:.4g} req/s ("
        + (peak_label.removeprefix("peak_") + " window" if peak_label else "mean")
        + ")"
        + (f", mean {mean:.4g} req/s" if mean is not None else ", mean unknown"),
        "kv_tokens": kv_source,
        "cached_share": "each candidate's fleet: the simulation's replay at its replica count "
        "and KV pool (below)",
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
        requests=workload,
        table_rows=requests.height,
        peak_rate_rps=peak,
        mean_rate_rps=mean,
        kv_tokens=kv_tokens,
        measured_arrivals=shape_stage.read_result(layout).metrics.arrivals,
        cache=cache,
        served=served,
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


def as_replayed(arrivals: Arrivals, sample: RequestSample | None) -> Arrivals:
    """A trace's arrivals with the CV of the gaps the search replays: the whole trace's CV also
    counts its rate's changes over the day, which the runs, each scaled to its surroundings,
    leave out."""
    if arrivals.kind != "trace" or sample is None or sample.size < 2:
        return arrivals
    gaps = np.diff(np.concatenate(([0.0], sample.unit_arrivals)))
    replayed = float(gaps.std() / gaps.mean())
    return arrivals.model_copy(
        update={
            "cv": replayed,
            "description": f"{arrivals.description}; gap CV {replayed:.2f} in the replayed runs",
        }
    )


def _cache_replays(
    layout: WorkloadLayout,
    replay: ReplayBasis,
    summaries: list[ScenarioSummary],
    requests: pl.DataFrame,
    workload: WorkloadRequests,
    keep_passes: bool,
) -> CacheReplays | Unknown:
    """The workload as the simulation's replay kernels read it, its scenarios (the routing),
    and each capacity request's row in it (requests without lengths are left out of both);
    ``Unknown`` when no scenario knows a hit (a trace without prompt content: nothing to
    replay, and nothing flattened for it)."""
    unknown = [s.hit_ratio for s in summaries if isinstance(s.hit_ratio, Unknown)]
    if len(unknown) == len(summaries):
        return unknown[0] if unknown else Unknown(reason="no simulated scenario")
    lengths = ["prompt_tokens", "output_tokens"]
    # None: every request has both lengths, so the input rows are the capacity's, in order
    rows = (
        None
        if not any(requests.get_column(c).null_count() for c in lengths)
        else requests.with_row_index("row")
        .drop_nulls(lengths)
        .get_column("row")
        .to_numpy()
        .astype(np.int64)
    )
    if sim_stage.streams(layout, replay.simulation):
        # too large to flatten: each fleet replay streams the parts, checked as it goes
        # by input row: the workload's own array when every request has its lengths
        prompt = (
            workload.prompt
            if rows is None
            else narrow(requests.get_column("prompt_tokens").fill_null(0).to_numpy())
        )
        return CacheReplays(
            # a union of days: each replay resumes after the days replayed before
            sim_stage.resumable_stream(
                layout, replay.latency, layout.fleet_passes, keeps=keep_passes
            ),
            replay.simulation,
            summaries,
            rows,
            expected_prompt=prompt,
            source=str(layout.ingest.requests),
        )
    inputs = sim_stage.read_inputs(layout, replay.latency)
    table = requests.get_column("prompt_tokens").to_numpy()
    if inputs.n != requests.height or not np.array_equal(
        inputs.prompt_tokens if rows is None else inputs.prompt_tokens[rows],
        (table if rows is None else table[rows]).astype(np.int64),
    ):
        raise InputFormatError(
            f"{layout.ingest.requests}: the simulation's flattened requests differ from the "
            "request table; re-run `enginefit simulate --config FILE`"
        )
    return CacheReplays(inputs, replay.simulation, summaries, rows)


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


def settle_replays(inputs: CapacityInputs) -> list[str]:
    """After :func:`run` (the stage's, not a what-if's): the kept passes of the fleet replays
    of a quarter streamed by days that it no longer asked for, removed; and what each replay
    resumed and what was removed, one line each."""
    cache = inputs.cache
    if not isinstance(cache, CacheReplays) or not isinstance(cache.inputs, DailyStream):
        return []
    cache.inputs.forget_unused()
    return [*cache.inputs.said, *(f"kept pass of {n} removed" for n in cache.inputs.forgotten)]


def run(inputs: CapacityInputs, settings: CapacityConfig) -> CapacityResult:
    """One candidate per benchmarked deployment, its serving model carried to the workload, and
    (once any deployment replayed the workload's own traffic) each one's predicted capacity
    against the measured one. A quarter streamed by days keeps each fleet replay's pass for
    the next day's run (:func:`settle_replays` removes those no longer asked for)."""
    workload = inputs.requests
    notes = list(inputs.notes)
    # Each candidate replays its own fleet's cache (a trace without prompt content has none).
    cache = inputs.cache if isinstance(inputs.cache, CacheReplays) else None
    pattern = arrival_pattern(inputs.measured_arrivals, settings, inputs.table_rows)
    points = inputs.points
    candidates = []
    keys = [k for k in DEPLOYMENT_KEYS if k in points.columns]
    groups = (
        points.select(keys).unique(maintain_order=True).sort(keys, nulls_last=True).to_dicts()
        if keys and not points.is_empty()
        else []
    )
    sample = (
        sample_requests(
            workload.prompt,
            workload.output,
            workload.cached,
            settings,
            pattern,
            workload.arrival_s,
        )
        if groups
        else None
    )
    arrivals = as_replayed(pattern, sample)
    # Once any deployment replayed this workload's own traffic, every candidate says how its
    # transferred capacity compares with a measured one (or why it cannot).
    checked = (
        not points.is_empty() and not points.filter(own_traffic(points, inputs.workload)).is_empty()
    )
    for key in groups:
        assert sample is not None  # drawn whenever there is a deployment
        rows = _deployment_filter(points, key)
        deployment = deployment_of(rows.row(0, named=True))
        bench_rows = _deployment_filter(inputs.bench_capacity, key)
        bench_candidates = sorted(
            {str(c) for c in _values(bench_rows, "candidate") if c is not None}
        )
        costs = _floats(bench_rows, "cost_per_1m_output_usd")
        manifest_prices = _floats(rows, "price_per_gpu_hour_usd")
        measured = not rows.filter(own_traffic(rows, inputs.workload)).is_empty()
        team_shape, shape_note = deployment_model_shape(
            inputs.model_shape, deployment.model, inputs.team_models
        )
        if shape_note is not None:
            notes.append(f"{deployment.describe()}: {shape_note}")
        fitted = _fit_deployment(inputs, settings, rows, bench_rows, team_shape)
        candidate = carry_to_workload(
            deployment.describe(),
            fitted.model,
            workload,
            inputs.slo,
            kv_tokens=fitted.kv_tokens,
            kv_source=fitted.kv_source,
            arrivals=arrivals,
            fleet_cache=cache,
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
        if isinstance(inputs.cache, Unknown) and isinstance(fitted.model, ServingModel):
            update["fleet_cache"] = inputs.cache  # why no replay gave cached tokens
        if team_shape is None and shape_note is not None:
            # Another model than the team's: whatever else, the figure is not yours.
            update["provisional_reason"] = "; ".join(
                r for r in (candidate.provisional_reason, shape_note) if r
            )
        if checked:
            update["prediction_check"] = _prediction_check(
                inputs, settings, rows, bench_rows, team_shape, sample=sample, cache=cache
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
        sources={**inputs.sources, "arrivals": arrivals.description},
        notes=notes,
    )


@dataclass(frozen=True)
class FittedDeployment:
    """One deployment's serving model (or why there is none) and its replica's KV pool."""

    model: ServingModel | Unknown
    kv_tokens: int
    kv_source: str


def _fit_deployment(
    inputs: CapacityInputs,
    settings: CapacityConfig,
    rows: pl.DataFrame,
    bench_rows: pl.DataFrame,
    team_shape: ModelShape | None,
) -> FittedDeployment:
    """The serving model fitted on a deployment's load points ``rows`` (its kept-up open-loop
    points; ``bench_rows``: the bench stage's capacity rows of the same sweeps, whose measured
    bracket the model's capacity check uses), with its limits and model shape, and its KV pool."""
    deployment = deployment_of(rows.row(0, named=True))
    usable = fit_points(rows, inputs.min_achieved_rate_share)
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
            measured_capacity=_bracket(_open_sweeps(bench_rows)),
            slo=inputs.slo,
        )
        if not usable.is_empty()
        else Unknown(
            reason=f"no kept-up open-loop load point sent at its offered rate for "
            f"{deployment.describe()}"
        )
    )
    kv_tokens, kv_source = deployment_kv_tokens(
        limits,
        shape,
        inputs.served.memory,
        deployment.gpu_type,
        deployment.gpu_count,
        (inputs.kv_tokens, inputs.sources.get("kv_tokens", "as given")),
    )
    return FittedDeployment(model, kv_tokens, kv_source)


def own_traffic(frame: pl.DataFrame, workload: str) -> pl.Expr:
    """The load points (or the bench stage's capacity rows) of ``enginefit loadtest`` replaying
    this workload's own trace."""
    return (
        (_column(frame, "dataset") == TRACE_DATASET) & (_column(frame, "workload") == workload)
    ).fill_null(False)


def _prediction_check(
    inputs: CapacityInputs,
    settings: CapacityConfig,
    rows: pl.DataFrame,
    bench_rows: pl.DataFrame,
    team_shape: ModelShape | None,
    *,
    sample: RequestSample,
    cache: CacheReplays | None,
) -> PredictionCheck | Unknown:
    """The deployment's capacity for this workload as the model fitted on its other sweeps
    alone predicts it (the same sample, arrivals and fleet cache as the candidate's), against
    the capacity the bench stage measured on the sweep of the workload's own traffic."""
    own = rows.filter(own_traffic(rows, inputs.workload))
    if own.is_empty():
        return Unknown(
            reason="this workload's own traffic was not benchmarked on this deployment "
            "(enginefit loadtest replays it): nothing to check its capacity against"
        )
    own_candidates = sorted({str(c) for c in _values(own, "candidate") if c is not None})
    in_own = (
        pl.col("candidate").is_in(own_candidates)
        if "candidate" in bench_rows.columns
        else pl.lit(False)
    )
    measured, measured_from = _measured_capacity(
        bench_rows.filter(in_own), ", ".join(own_candidates) or "the own-traffic benchmark"
    )
    others = rows.filter(~own_traffic(rows, inputs.workload))
    other_bench = bench_rows.filter(~in_own)
    fitted_from = sorted({str(c) for c in _values(other_bench, "candidate") if c is not None})
    predicted: float | Unknown
    if others.is_empty():
        predicted = Unknown(
            reason="only this workload's own traffic was benchmarked on this deployment: no "
            "sweep at another mix to fit a model without it (benchmark another mix too)"
        )
    else:
        fitted = _fit_deployment(inputs, settings, others, other_bench, team_shape)
        predicted = predicted_capacity(
            fitted.model,
            sample,
            inputs.slo,
            kv_tokens=fitted.kv_tokens,
            kv_source=fitted.kv_source,
            peak_rate_rps=inputs.peak_rate_rps,
            config=settings,
            fleet_cache=cache,
        )
    return prediction_check(
        predicted, measured, fitted_from=fitted_from, measured_from=measured_from
    )


def _open_sweeps(bench_rows: pl.DataFrame) -> pl.DataFrame:
    """The bench stage's capacity rows of open-loop sweeps (all of them when not told)."""
    return (
        bench_rows.filter(pl.col("sweep") == "open")
        if "sweep" in bench_rows.columns
        else bench_rows
    )


def _measured_capacity(own_bench: pl.DataFrame, named: str) -> tuple[float | Unknown, str]:
    """The SLO capacity the bench stage measured on the workload's own traffic (its open-loop
    sweep bracketed by a pass and a failure; the highest of several), and the sweep's name;
    ``Unknown`` saying what the sweep lacks."""
    rows = _open_sweeps(own_bench)
    if rows.is_empty():
        return Unknown(
            reason=f"{named} has no open-loop sweep at set rates, so no measured capacity at "
            "the SLO"
        ), named
    ranked = sorted(
        rows.iter_rows(named=True),
        key=lambda r: (
            r.get("capacity_status") != "bracketed",
            -(r.get("capacity_rps") or 0.0),
            str(r.get("candidate")),
        ),
    )
    best = ranked[0]
    name = str(best.get("candidate") or named)
    status, rate = best.get("capacity_status"), best.get("capacity_rps")
    if status == "bracketed" and rate is not None and math.isfinite(rate) and rate > 0:
        return float(rate), name
    if status == "not_bracketed" and rate is not None:
        why = (
            f"it met the SLO at every rate it sent, up to {rate:.3g} req/s: its capacity lies "
            "above, unmeasured; load-test higher rates"
        )
    elif status == "below_range":
        why = (
            f"it failed the SLO from its lowest rate ({best.get('first_fail_load')} req/s): its "
            "capacity lies below, unmeasured; load-test lower rates"
        )
    else:
        why = "no rate it sent passed or failed the SLO, so no capacity was measured"
    return Unknown(reason=f"{name}: {why}"), name


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
