"""What the decision reads, reduced to the few numbers its rules use, each traceable to a stage
output: the workload's position on the axes of docs/decision-rules.md, each engine's benchmark
evidence, and the flat ``measurements`` that revisit triggers compare quarter to quarter.

A number a stage did not produce (no trace content, no benchmark) is None here and ``unknown``
in the record, never 0.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field, replace
from typing import Any

import polars as pl

from pipeline.bench.result import BenchResult, CapacityRow
from pipeline.capacity.result import CandidateCapacity, CapacityResult, WorkloadCost
from pipeline.costing import (
    SECONDS_PER_MONTH,
    Band,
    fractional_replicas,
    fractional_replicas_band,
    monthly_usd,
    per_capacity_band,
    replicas_band,
    replicas_for,
)
from pipeline.decision.catalog import FEATURES, Catalog
from pipeline.decision.config import DecisionConfig, Requirements
from pipeline.errors import ConfigError
from pipeline.prefix.result import CurvePoint, PrefixSummary
from pipeline.shape.result import ShapeMetrics
from pipeline.thresholds import LONG_CONTEXT_TOKENS, PREFIX_WINDOW_TOKENS
from pipeline.unknown import Unknown

# Capacity rows ranked apart by how much of the curve they saw (pipeline/bench/cost.py).
RANK_POOLS = ("bracketed", "lower_bound", "single_point")
# Validity findings that say a benchmark is not about this traffic
# (docs/decision-rules.md#transferability). ``peak_rate`` is not one: one replica below
# production's peak is what a fleet of several replicas is sized for.
TRANSFER_CHECKS = frozenset(
    {
        "closed_loop",
        "comparability",
        "fixed_length_prompts",
        "output_length",
        "prefix_structure",
        "prompt_length",
        "stale",
    }
)


@dataclass(frozen=True)
class Workload:
    """The workload on the axes of docs/decision-rules.md (shape and prefix stage outputs)."""

    requests: int | None = None
    mean_rate_rps: float | None = None
    peak_rate_rps: float | None = None
    peak_window: str | None = None
    peak_concurrency: float | None = None
    concurrency_estimated: bool = False
    prompt_p50: float | None = None
    prompt_p99: float | None = None
    output_p50: float | None = None
    output_p99: float | None = None
    output_mean: float | None = None
    prompt_mean: float | None = None
    features_seen: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    prefix_share: float | None = None
    prefix_window_tokens: int | None = None
    prefix_shape: str | None = None
    cross_tenant_share: float | None = None
    tenants: int | None = None
    tail_findings: tuple[str, ...] = ()  # the shape stage's long-tail findings, as worded there
    unknown: dict[str, str] = field(default_factory=dict)

    @property
    def output_tokens_per_month(self) -> float | None:
        if self.mean_rate_rps is None or self.output_mean is None:
            return None
        return self.mean_rate_rps * self.output_mean * SECONDS_PER_MONTH


def workload_from(
    shape: ShapeMetrics | None,
    prefix: PrefixSummary | None,
    settings: DecisionConfig,
    peak_window: str,
    missing: dict[str, str],
) -> Workload:
    """The workload view from the shape metrics and prefix summary (either may be absent)."""
    values: dict[str, Any] = {"unknown": dict(missing)}
    if shape is not None:
        prompt, output = shape.lengths.prompt_tokens, shape.lengths.output_tokens
        peaks = shape.arrivals.peak_rates()
        window = (
            peak_window
            if peak_window in peaks
            else (max(peaks, key=lambda k: peaks[k]) if peaks else None)
        )
        tenants = shape.tenants
        values |= {
            "requests": shape.requests,
            "mean_rate_rps": shape.arrivals.mean_rate_rps,
            "peak_rate_rps": peaks.get(window) if window else None,
            "peak_window": window,
            "peak_concurrency": shape.concurrency.peak,
            "concurrency_estimated": shape.concurrency.estimated,
            "prompt_p50": prompt.p50,
            "prompt_p99": prompt.p99,
            "prompt_mean": prompt.mean,
            "output_p50": output.p50,
            "output_p99": output.p99,
            "output_mean": output.mean,
            "features_seen": features_seen(shape, settings),
            "models": tuple(m.value for m in shape.models.top if m.value),
            "tenants": tenants.distinct if tenants.logged else None,
            "tail_findings": tuple(
                f.message
                for f in shape.findings
                if f.id in ("output_tail.long", "prompt_tail.long")
            ),
        }
    if prefix is not None:
        share, window_tokens = share_at(prefix.curve, PREFIX_WINDOW_TOKENS)
        cross = prefix.reuse.cross_tenant
        values |= {
            "prefix_share": share,
            "prefix_window_tokens": window_tokens,
            "prefix_shape": prefix.classification.shape,
            "cross_tenant_share": cross.cross_tenant_share_of_hits if cross else None,
        }
        if share is None:
            values["unknown"]["prefix_share"] = "the trace carries no prompt content"
    return Workload(**values)


def features_seen(shape: ShapeMetrics, settings: DecisionConfig) -> tuple[str, ...]:
    """Required features the traffic itself uses (docs/decision-rules.md#features): LoRA adapters,
    structured output, tools, and prompts at long-context length."""
    features = shape.features
    seen = {
        "lora": features.lora_adapter.requests > 0,
        "structured_output": features.structured_output.requests > 0,
        "tool_calls": features.tools.requests > 0,
        "long_context": (shape.lengths.prompt_tokens.p99 or 0) >= LONG_CONTEXT_TOKENS,
    }
    # Speculative decoding is a server-side choice no request shows: required only if configured.
    return tuple(f for f in FEATURES if seen.get(f, False))


def share_at(curve: list[CurvePoint], window_tokens: int) -> tuple[float | None, int | None]:
    """The shared-prefix share at the largest curve window not above ``window_tokens`` (the
    smallest window when all are above it); None for a curve without content."""
    points = sorted(
        ((p.window_tokens, p.share) for p in curve if p.share is not None), key=lambda p: p[0]
    )
    if not points:
        return None, None
    below = [p for p in points if p[0] <= window_tokens]
    window, share = below[-1] if below else points[0]
    return share, window


@dataclass(frozen=True)
class EngineBench:
    """One engine's best benchmark evidence on this workload (its cheapest capacity row in the
    most trustworthy rank pool), with the monthly fleet cost at the workload's rates."""

    engine: str
    candidate: str
    capacity_status: str
    rank_pool: str | None
    capacity_rps: float | None
    cost_per_1m_output_usd: float | None
    gpu_type: str | None
    gpu_count: int | None
    gpu_hour_usd: float | None
    monthly_gpu_usd: float | None  # fleet at the peak rate
    monthly_gpu_usd_mean_rate: float | None
    replicas_at_peak: int | None
    flags: tuple[str, ...]
    run_date: dt.date | None
    ttft_per_prompt_token_ms: float | None
    input_tokens_per_s: float | None  # sustained prompt tokens/s at the SLO capacity
    manifest_file: str | None
    model: str | None = None
    # The serving backend the benchmark's manifest names (``backend``), None when it does not:
    # it decides the model-change cost of an engine whose cost depends on it (TensorRT-LLM).
    backend: str | None = None
    # Why this benchmark is not about the team's deployment (other hardware, other model):
    # its cost is shown but never ranked.
    mismatches: tuple[str, ...] = ()
    # Whose figures capacity_rps, cost_per_1m_output_usd, monthly_gpu_usd(_mean_rate) and
    # replicas_at_peak are: the workload's (the capacity stage's serving model carried to this
    # workload's mix, :func:`with_capacity`) or the benchmark's own; why, when the benchmark's.
    cost_basis: str = "benchmark"
    cost_note: str | None = None
    capacity: CandidateCapacity | None = None
    benchmark_capacity_rps: float | None = None
    benchmark_cost_per_1m_output_usd: float | None = None
    benchmark_monthly_gpu_usd: float | None = None
    benchmark_replicas_at_peak: int | None = None
    # How the fleet is sized: the peak rate it serves, the headroom kept on each replica and
    # an N+1 spare (the capacity stage's settings for the workload's figures; the bench
    # stage's plain ⌈rate ÷ capacity⌉ for the benchmark's).
    sizing_rate_rps: float | None = None
    headroom: float = 1.0
    n_plus_one: bool = False
    # The benchmark's repeat-run noise: relative range of its cost over repeated runs at the
    # capacity load (None: not repeated), and how many runs.
    noise_share: float | None = None
    repeats: int | None = None
    # The band the workload's capacity is known within (the capacity stage's: fit residuals and
    # validation error); None for the benchmark's own figures, which have their noise instead.
    capacity_band_rps: Band | None = None

    @property
    def fractional_replicas(self) -> float | None:
        """The fleet before rounding up to whole replicas (the spare stays whole)."""
        if self.sizing_rate_rps is None or not self.capacity_rps:
            return None
        return fractional_replicas(
            self.sizing_rate_rps, self.capacity_rps, self.headroom, self.n_plus_one
        )

    @property
    def fractional_monthly_gpu_usd(self) -> float | None:
        """What the fleet costs a month at :attr:`fractional_replicas`: the ranking compares
        engines on it, so whole-replica rounding neither hides a real gap (both need one
        replica) nor inflates one (one replica against two); the bill stays whole replicas."""
        replicas, per_replica = self.fractional_replicas, self._replica_monthly_usd
        return replicas * per_replica if replicas is not None and per_replica is not None else None

    @property
    def replicas_band_at_peak(self) -> tuple[int, int] | None:
        """Whole replicas at the peak at the capacity band's ends: (fewest, most)."""
        band, rate = self.capacity_band_rps, self.sizing_rate_rps
        if band is None or rate is None:
            return None
        return replicas_band(rate, band, self.headroom, self.n_plus_one)

    @property
    def monthly_gpu_band_usd(self) -> Band | None:
        """The bill (whole replicas at the peak) at the capacity band's ends: (low, high)."""
        replicas, per_replica = self.replicas_band_at_peak, self._replica_monthly_usd
        if replicas is None or per_replica is None:
            return None
        return replicas[0] * per_replica, replicas[1] * per_replica

    @property
    def fractional_monthly_gpu_band_usd(self) -> Band | None:
        """:attr:`fractional_monthly_gpu_usd` at the capacity band's ends: (low, high)."""
        band, per_replica = self.capacity_band_rps, self._replica_monthly_usd
        if band is None or per_replica is None or self.sizing_rate_rps is None:
            return None
        fewest, most = fractional_replicas_band(
            self.sizing_rate_rps, band, self.headroom, self.n_plus_one
        )
        return fewest * per_replica, most * per_replica

    @property
    def cost_per_1m_output_band_usd(self) -> Band | None:
        """The all-in cost per 1M output tokens at the capacity band's ends: (low, high)."""
        band, cost, capacity = (
            self.capacity_band_rps,
            self.cost_per_1m_output_usd,
            self.capacity_rps,
        )
        if band is None or cost is None or not capacity:
            return None
        return per_capacity_band(cost, capacity, band)

    @property
    def _replica_monthly_usd(self) -> float | None:
        if self.monthly_gpu_usd is None or not self.replicas_at_peak:
            return None
        return self.monthly_gpu_usd / self.replicas_at_peak

    def rescaled(self, *, rate: float = 1.0, cost: float = 1.0, price: float = 1.0) -> EngineBench:
        """This evidence with the traffic × ``rate``, the engine's cost per token × ``cost``
        (its capacity ÷ ``cost``) and the GPU price × ``price``: the fleet re-sized in whole
        replicas as the stage sizes it. What the what-if of a flip condition re-decides on."""
        capacity = self.capacity_rps / cost if self.capacity_rps is not None else None
        rate_rps = self.sizing_rate_rps * rate if self.sizing_rate_rps is not None else None
        replicas = self.replicas_at_peak
        if capacity and rate_rps is not None:
            replicas = replicas_for(rate_rps, capacity, self.headroom, self.n_plus_one)
        per_replica = self._replica_monthly_usd
        per_1m = self.cost_per_1m_output_usd
        band = self.capacity_band_rps
        return replace(
            self,
            capacity_rps=capacity,
            capacity_band_rps=(band[0] / cost, band[1] / cost) if band is not None else None,
            sizing_rate_rps=rate_rps,
            replicas_at_peak=replicas,
            gpu_hour_usd=self.gpu_hour_usd * price if self.gpu_hour_usd is not None else None,
            monthly_gpu_usd=per_replica * price * replicas
            if per_replica is not None and replicas is not None
            else None,
            cost_per_1m_output_usd=per_1m * cost * price if per_1m is not None else None,
        )

    @property
    def workload_cost(self) -> WorkloadCost | None:
        cost = self.capacity.cost if self.capacity is not None else None
        return cost if isinstance(cost, WorkloadCost) else None

    @property
    def slo_never_met(self) -> bool:
        return self.capacity_status == "below_range"

    def age_days(self, as_of: dt.date | None) -> int | None:
        if as_of is None or self.run_date is None:
            return None
        return (as_of - self.run_date).days


def _pool_order(pool: str | None) -> int:
    return RANK_POOLS.index(pool) if pool in RANK_POOLS else len(RANK_POOLS)


def gpu_vendor(gpu_type: str | None) -> str | None:
    """The hardware target of a benchmark's GPU type (``H100-80GB`` → nvidia); None when the
    name says nothing recognisable."""
    if not gpu_type:
        return None
    name = gpu_type.strip().lower()
    for vendor, pattern in _VENDORS:
        if re.search(pattern, name):
            return vendor
    return None


_VENDORS = (
    ("amd", r"\bamd\b|\bmi\d{3}|radeon|instinct"),
    ("gaudi", r"gaudi|\bhpu\b"),
    ("intel-gpu", r"intel|\barc\b|data center gpu max|\bmax ?1\d{3}"),
    ("tpu", r"\btpu|\bv\d+e?\b|trillium"),
    ("neuron", r"inferentia|trainium|neuron"),
    ("apple", r"apple|\bm\d( (pro|max|ultra))?\b"),
    ("cpu", r"\bcpu\b|xeon|epyc|graviton"),
    (
        "nvidia",
        r"nvidia|geforce|rtx|tesla|\bdgx|\b(gh|gb)\d{3}|\b[habvlt]\d{1,3}[a-z]?\b|\bl\d{1,2}s?\b",
    ),
)


def mismatches(
    gpu_type: str | None, model: str | None, hardware: tuple[str, ...], models: tuple[str, ...]
) -> tuple[str, ...]:
    """Why a benchmark does not describe the team's deployment (empty: it does, or it cannot
    be told)."""
    out = []
    vendor = gpu_vendor(gpu_type)
    if hardware and vendor is not None and vendor not in hardware:
        out.append(f"run on {gpu_type} ({vendor}); your hardware is {', '.join(hardware)}")
    if models and model and model not in models:
        out.append(f"run with {model}; you serve {', '.join(models)}")
    return tuple(out)


def engine_benches(
    bench: BenchResult,
    fits: pl.DataFrame | None,
    catalog: Catalog,
    hardware: tuple[str, ...] = (),
    models: tuple[str, ...] = (),
    *,
    as_of: dt.date | None = None,
    max_age_days: int,
) -> dict[str, EngineBench]:
    """Per catalog engine, its best benchmark evidence — one about the team's hardware and
    models when there is one. An engine name the catalog does not know is an error naming the
    manifest it came from."""
    if bench.capacity.is_empty():
        return {}
    points = bench.evaluated
    out: dict[str, EngineBench] = {}
    rows = sorted(
        bench.capacity_rows(),
        key=lambda r: (
            bool(mismatches(r.gpu_type, r.model, hardware, models)),
            _pool_order(r.rank_pool),
            r.cost_per_1m_output_usd is None,
            r.cost_per_1m_output_usd or 0.0,
            r.candidate,
            r.sweep or "",
        ),
    )
    for row in rows:
        manifest = _first(points, row.candidate, "manifest_file")
        where = f"{manifest or row.candidate}: engine"
        engine = catalog.require_engine(row.engine or "", where)
        if engine in out:
            continue
        run_date = _run_date(points, row.candidate)
        flags = _flags(bench.findings, row.candidate)
        # The bench stage was given no report date to check the age against: the decision's
        # date (pipeline.dates) does.
        age = (as_of - run_date).days if as_of is not None and run_date is not None else None
        if bench.as_of is None and age is not None and age > max_age_days:
            flags = tuple(sorted({*flags, "stale"}))
        backend = _backend(catalog, engine, _first(points, row.candidate, "backend"), manifest)
        out[engine] = EngineBench(
            engine=engine,
            candidate=row.candidate,
            capacity_status=row.capacity_status or "unknown",
            rank_pool=row.rank_pool,
            capacity_rps=row.capacity_rps,
            cost_per_1m_output_usd=row.cost_per_1m_output_usd,
            gpu_type=row.gpu_type,
            gpu_count=row.gpu_count,
            gpu_hour_usd=row.gpu_hour_usd,
            monthly_gpu_usd=_fleet(bench.fleet, row, "monthly_usd"),
            monthly_gpu_usd_mean_rate=_fleet(bench.fleet, row, "monthly_usd", peak=False),
            replicas_at_peak=_fleet(bench.fleet, row, "replicas"),
            sizing_rate_rps=_fleet(bench.fleet, row, "rate_rps"),
            noise_share=row.cost_spread,
            repeats=row.repeats,
            flags=flags,
            run_date=run_date,
            ttft_per_prompt_token_ms=_fit(fits, row.candidate),
            input_tokens_per_s=_input_rate(row),
            manifest_file=manifest,
            model=row.model,
            backend=backend,
            mismatches=mismatches(row.gpu_type, row.model, hardware, models),
        )
    return out


BENCHMARK_FIGURES = "costs are the benchmark's own figures, not this workload's"


def with_capacity(
    benches: dict[str, EngineBench],
    capacity: CapacityResult | None,
    catalog: Catalog,
    missing_reason: str | None,
    mean_rate_rps: float | None,
) -> dict[str, EngineBench]:
    """Each engine's evidence with the workload's own capacity and cost in place of the
    benchmark's (kept beside them as ``benchmark_*``): capacity at the SLO for this workload's
    mix, replicas at its peak, the monthly cost of that fleet and the all-in cost per 1M output
    tokens. Where the capacity is unknown the benchmark's figures stay, with the reason."""
    out = {}
    for engine, bench in benches.items():
        kept = replace(
            bench,
            benchmark_capacity_rps=bench.capacity_rps,
            benchmark_cost_per_1m_output_usd=bench.cost_per_1m_output_usd,
            benchmark_monthly_gpu_usd=bench.monthly_gpu_usd,
            benchmark_replicas_at_peak=bench.replicas_at_peak,
        )
        if capacity is None:
            why = (
                "the capacity stage has not run"
                if missing_reason is None or "no capacity result" in missing_reason
                else missing_reason
            )
            out[engine] = replace(kept, cost_note=f"{BENCHMARK_FIGURES}: {why}")
            continue
        found = _capacity_of(capacity, bench, catalog)
        if found is None:
            note = f"{BENCHMARK_FIGURES}: the capacity result has no candidate {bench.candidate!r}"
            out[engine] = replace(kept, cost_note=note)
            continue
        cost = found.cost
        if not isinstance(cost, WorkloadCost) or isinstance(found.workload_capacity_rps, Unknown):
            reason = (
                found.workload_capacity_rps.reason
                if isinstance(found.workload_capacity_rps, Unknown)
                else cost.reason
                if isinstance(cost, Unknown)
                else "unknown"
            )
            if isinstance(found.serving_model, Unknown):
                note = f"{BENCHMARK_FIGURES}: this workload's capacity is unknown ({reason})"
                out[engine] = replace(kept, capacity=found, cost_note=note)
                continue
            # The fitted model says this workload cannot be served at the SLO on this
            # deployment: the benchmark's figure must not stand in for it.
            out[engine] = replace(
                kept,
                cost_basis="workload",
                cost_note=f"this workload's capacity at the SLO is unknown: {reason}",
                capacity=found,
                capacity_rps=None,
                cost_per_1m_output_usd=None,
                monthly_gpu_usd=None,
                monthly_gpu_usd_mean_rate=None,
                replicas_at_peak=None,
            )
            continue
        out[engine] = replace(
            kept,
            cost_basis="workload",
            cost_note=found.provisional_reason,
            capacity=found,
            capacity_rps=found.workload_capacity_rps,
            capacity_band_rps=None
            if isinstance(found.workload_capacity_band_rps, Unknown)
            else found.workload_capacity_band_rps,
            cost_per_1m_output_usd=cost.all_in_cost_per_1m_output_usd,
            monthly_gpu_usd=cost.monthly_cost_usd,
            monthly_gpu_usd_mean_rate=_monthly_at(cost, found.workload_capacity_rps, mean_rate_rps),
            replicas_at_peak=cost.replicas,
            gpu_hour_usd=cost.gpu_hour_usd,
            # peak utilisation = peak rate ÷ (replicas × capacity): the rate the fleet serves
            sizing_rate_rps=cost.peak_utilisation * cost.replicas * found.workload_capacity_rps,
            headroom=cost.headroom,
            n_plus_one=cost.n_plus_one,
        )
    return out


def _capacity_of(
    capacity: CapacityResult, bench: EngineBench, catalog: Catalog
) -> CandidateCapacity | None:
    """The capacity stage's candidate for this benchmark: the same candidate label, else the
    only one of the same engine."""
    exact = [c for c in capacity.candidates if c.candidate == bench.candidate]
    if exact:
        return exact[0]
    same = [
        c for c in capacity.candidates if catalog.engine_key(c.deployment.engine) == bench.engine
    ]
    return same[0] if len(same) == 1 else None


def _monthly_at(cost: WorkloadCost, capacity_rps: float, rate_rps: float | None) -> float | None:
    """The monthly cost of the fleet sized the same way for ``rate_rps`` (the mean rate)."""
    if rate_rps is None or rate_rps <= 0 or capacity_rps <= 0:
        return None
    replicas = replicas_for(rate_rps, capacity_rps, cost.headroom, cost.n_plus_one)
    return monthly_usd(replicas * (cost.gpus // max(cost.replicas, 1)), cost.gpu_hour_usd)


def _input_rate(row: CapacityRow) -> float | None:
    total, output = row.total_throughput_tps, row.output_throughput_tps
    if total is None or output is None or total <= output:
        return None
    return float(total - output)


def _backend(catalog: Catalog, engine: str, backend: Any, manifest: str | None) -> str | None:
    """The manifest's ``backend`` for ``engine``, checked against the catalog's backends (a
    removed one is read: the rules say it no longer exists)."""
    if backend is None:
        return None
    spec = catalog.engines[engine]
    if str(backend) in (*spec.backends, *spec.removed_backends):
        return str(backend)
    has = (
        f"its backends are {', '.join(spec.backends)}"
        if spec.backends
        else "it has no backends to choose"
    )
    raise ConfigError(
        f"{manifest or engine}: backend: {spec.name} has no backend {backend!r} in the engine "
        f"catalog ({has}); fix the manifest's backend key"
    )


def _first(points: pl.DataFrame, candidate: str, column: str) -> Any:
    if column not in points.columns:
        return None
    values = points.filter(pl.col("candidate") == candidate).get_column(column).drop_nulls()
    return values.sort().first() if values.len() else None


def _fleet_rows(fleet: pl.DataFrame, row: CapacityRow, peak: bool) -> pl.DataFrame:
    if fleet.is_empty():
        return fleet
    label = pl.col("rate_label")
    chosen = label.str.starts_with("peak") if peak else label == "mean"
    keys = pl.col("candidate") == row.candidate
    if row.sweep is not None and "sweep" in fleet.columns:
        keys &= pl.col("sweep") == row.sweep
    return fleet.filter(keys & chosen)


def _fleet(fleet: pl.DataFrame, row: CapacityRow, column: str, peak: bool = True) -> Any:
    """The largest ``column`` of the bench stage's fleet for ``row`` at the peak rates (the
    largest peak window's), else at the mean rate; None when there is none."""
    values = _fleet_rows(fleet, row, peak).get_column(column).drop_nulls()
    return values.max() if values.len() else None


def _flags(findings: pl.DataFrame, candidate: str) -> tuple[str, ...]:
    if findings.is_empty():
        return ()
    flagged = findings.filter(
        pl.col("candidate").is_in([candidate, "(all candidates)"])
        & (pl.col("status") == "flag")
        & pl.col("check").is_in(sorted(TRANSFER_CHECKS))
    )
    return tuple(sorted(set(flagged.get_column("check").to_list())))


def _run_date(points: pl.DataFrame, candidate: str) -> dt.date | None:
    value = _first(points, candidate, "run_date")
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    return dt.date.fromisoformat(str(value)[:10])


def _fit(fits: pl.DataFrame | None, candidate: str) -> float | None:
    if fits is None or fits.is_empty() or "ttft_per_prompt_token_ms" not in fits.columns:
        return None
    rows = fits.filter((pl.col("candidate") == candidate) & pl.col("fitted").fill_null(False))
    values = rows.get_column("ttft_per_prompt_token_ms").drop_nulls()
    return float(values.first()) if values.len() else None  # type: ignore[arg-type]


def missing_features(engine: str, catalog: Catalog, required: tuple[str, ...]) -> list[str]:
    """Required features the engine does not support at all (``limited`` is not missing)."""
    spec = catalog.engines[engine]
    return [f for f in required if spec.support(f).support == "unsupported"]


def required_features(requirements: Requirements, workload: Workload) -> tuple[str, ...]:
    wanted = set(requirements.features) | set(workload.features_seen)
    return tuple(f for f in FEATURES if f in wanted)
