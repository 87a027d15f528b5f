"""Whole decision scenarios built in code: a generated trace, generated benchmark load points,
the team's requirements; the real shape, prefix, simulation and bench stages run on them,
then the decision stage reads their written outputs (nothing hand-written between stages)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest.mock import patch

import polars as pl
import yaml

from pipeline import results
from pipeline.bench import stage as bench_stage
from pipeline.capacity.compute import capacity_result, carry_to_workload, workload_requests
from pipeline.capacity.result import CapacityResult, ServingModel
from pipeline.commands.decision import configured_inputs
from pipeline.config import Config, config_from_mapping
from pipeline.decision import stage as decision_stage
from pipeline.decision.result import DecisionRecord
from pipeline.layout import WorkloadLayout
from pipeline.prefix import stage as prefix_stage
from pipeline.schema import conform
from pipeline.shape import stage as shape_stage
from pipeline.sim import stage as sim_stage
from pipeline.store import read_requests
from tests.bench_points import kept_up_run
from tests.capacity_scenarios import CONFIG, KV_TOKENS, SLO
from tests.conftest import write_requests

BLOCK = 16
START = datetime(2026, 9, 1, tzinfo=UTC)
RUN_DATE = date(2026, 11, 1)  # benchmarks four weeks before the decision: not stale
AS_OF = "2026-11-29"
GPU_HOUR_USD = 3.0


# requirements.kv_cache for Llama-3.1-8B in BF16 on one H100-80GB (about 450k tokens a replica;
# 15 GiB of weights in 69.9 GiB usable).
LLAMA_8B_ON_H100 = {
    "gpu_memory_gib": 79.2,
    "gpus_per_replica": 1,
    "memory_utilization": 0.92,
    "overhead_gib": 3.0,
    "model_params_billion": 8.03,
    "weight_bytes": 2.0,
    "layers": 32,
    "kv_heads": 8,
    "head_dim": 128,
    "kv_bytes": 2.0,
}


def traffic(
    requests: int,
    *,
    rate_rps: float,
    e2e_s: float,
    output_tokens: int = 200,
    conversations: int | None = None,
    system_blocks: int = 0,
    turn_blocks: int = 8,
    tenants: int = 1,
) -> pl.DataFrame:
    """``requests`` evenly spaced at ``rate_rps``, each lasting ``e2e_s`` (logged, so peak
    concurrency is exact: ⌈rate × e2e⌉ or ⌊…⌋ + 1).

    Without ``conversations`` every prompt is ``turn_blocks`` unique blocks (no sharing). With
    it, request i belongs to conversation i mod ``conversations`` (tenant = conversation mod
    ``tenants``): its prompt is a ``system_blocks`` system prompt shared by every request, then
    its conversation's history — every earlier turn's ``turn_blocks`` blocks — then its own.
    """
    rows = []
    history: dict[int, list[int]] = {}
    for i in range(requests):
        conv = i % conversations if conversations else i
        own = [10_000_000 + i * 1_000 + k for k in range(turn_blocks)]
        past = history.get(conv, []) if conversations else []
        chain = [*range(1, system_blocks + 1), *past, *own]
        if conversations:
            history[conv] = [*past, *own]
        rows.append(
            {
                "request_id": f"r{i}",
                "arrival": START + timedelta(seconds=i / rate_rps),
                "session_id": f"c{conv}" if conversations else None,
                "tenant": f"t{conv % tenants}",
                "prompt_tokens": len(chain) * BLOCK,
                "output_tokens": output_tokens,
                "e2e_ms": e2e_s * 1000.0,
                "block_size": BLOCK,
                "prefix_hashes": chain,
                "prompt_blocks": len(chain),
                "hashes_known": True,
            }
        )
    return conform(pl.DataFrame(rows, schema_overrides={"prefix_hashes": pl.List(pl.UInt64)}))


def steady_traffic(requests: int = 1_200) -> pl.DataFrame:
    """20 req/s, 1 s each (peak concurrency 20), 200 output tokens, no sharing:
    20 × 200 × 730 × 3600 = 10.5 billion output tokens a month ("huge volume" ≥ 10 billion)."""
    return traffic(requests, rate_rps=20, e2e_s=1.0)


@dataclass(frozen=True)
class Sweep:
    """One engine's benchmark: vLLM ``bench serve`` result files (one per load) and the sidecar
    manifest that names the engine and GPUs, as a team would have them on disk."""

    engine: str
    records: list[dict[str, Any]]
    manifest: dict[str, Any]

    def write(self, folder: Path, session: int = 0) -> Path:
        """The files under ``folder``; each load of benchmark session number ``session`` starts
        at its own time, as real runs do (two byte-identical files are one run, read once)."""
        folder.mkdir(parents=True, exist_ok=True)
        for i, record in enumerate(self.records):
            started = f"{record['date'][:9]}{12 + session:02d}{i:02d}00"
            (folder / f"{self.engine}-{record['request_rate']:g}qps.json").write_text(
                json.dumps({**record, "date": started})
            )
        (folder / "enginefit-bench.yaml").write_text(yaml.safe_dump(self.manifest))
        return folder


def sweep(
    engine: str,
    capacity_rps: float,
    *,
    gpu_type: str = "H100",
    gpu_count: int = 1,
    output_tokens_mean: int = 200,
    input_tokens_mean: int = 128,
    run_date: date = RUN_DATE,
    never_met: bool = False,
    backend: str | None = None,
) -> Sweep:
    """An open-loop sweep at ½, 1 and 4 × ``capacity_rps`` whose last point fails the p95 TTFT
    limit (every point with ``never_met``): capacity is bracketed at ``capacity_rps``. Each run
    sends 100 requests lasting 1 s each, so it takes 100 ÷ rate + 1 s and kept up with its
    rate once the drain is taken off (tests/bench_points.py)."""
    records = []
    for load, ttft in (
        (capacity_rps / 2, 300.0),
        (capacity_rps, 800.0),
        (capacity_rps * 4, 4000.0),
    ):
        run = kept_up_run(load)
        n, duration = run["num_requests"], run["duration_s"]
        records.append(
            {
                "date": "20261101-120000",
                "backend": "vllm",
                "model_id": "m",
                "request_rate": load,
                "burstiness": 1.0,
                "max_concurrency": None,
                "num_prompts": n,
                "duration": duration,
                "completed": n,
                "failed": 0,
                "total_input_tokens": n * input_tokens_mean,
                "total_output_tokens": n * output_tokens_mean,
                "request_throughput": n / duration,
                "output_throughput": n * output_tokens_mean / duration,
                "total_token_throughput": n * (input_tokens_mean + output_tokens_mean) / duration,
                "p95_ttft_ms": 4000.0 if never_met else ttft,
                "mean_ttft_ms": ttft / 2,
                "p99_itl_ms": 30.0,
                "mean_itl_ms": 20.0,
                "mean_tpot_ms": 20.0,
                "mean_e2el_ms": run["e2e_mean_ms"],
            }
        )
    manifest = {
        "engine": engine,
        "engine_version": "1.0",
        "gpu_type": gpu_type,
        "gpu_count": gpu_count,
        "run_date": run_date.isoformat(),
        "model": "m",
    }
    if backend is not None:
        manifest["backend"] = backend  # the engine's serving backend (TensorRT-LLM's)
    return Sweep(engine, records, manifest)


def configuration(
    root: Path,
    requirements: dict[str, Any] | None = None,
    *,
    replicas: tuple[int, ...] = (1, 4),
    cache_tokens: int = 1_000_000,
    routings: tuple[str, ...] = ("round-robin", "affinity"),
    compare_isolation: bool = False,
    results: list[Path] | None = None,
    decision: dict[str, Any] | None = None,
) -> Config:
    return config_from_mapping(
        {
            "workload": {"name": "w", "traces": ["unused.jsonl"], "hash_salt": "s"},
            "paths": {"data_dir": str(root / "data"), "reports_dir": str(root / "reports")},
            "simulation": {
                "block_sizes": [BLOCK],
                "replicas": list(replicas),
                "cache_tokens": [cache_tokens],
                "routings": list(routings),
                "request_lifetime": "instant",
                "compare_isolation": compare_isolation,
            },
            "bench": {
                "as_of": AS_OF,
                "prices": {"gpu_hour_usd": {"default": GPU_HOUR_USD}},
                "results": [str(r) for r in results or []],
            },
            "requirements": requirements or {},
            "decision": decision or {},
        },
        source=root / "enginefit.yaml",
    )


CapacityWriter = Callable[[WorkloadLayout, Config], CapacityResult]


def capacity_of(model: ServingModel, *, cached_share: float = 0.0) -> CapacityWriter:
    """A capacity stage stand-in: ``model`` (one benchmarked deployment's fitted serving model)
    carried to the workload the other stages read, at the GPU price of these fixtures, written
    to ``capacity/capacity.json`` where the decision reads it."""

    def write(layout: WorkloadLayout, cfg: Config) -> CapacityResult:
        frame = read_requests(layout).select("prompt_tokens", "output_tokens").collect()
        work = workload_requests(frame, cached_share=cached_share)
        arrivals = shape_stage.read_result(layout).metrics.arrivals
        peaks = arrivals.peak_rates()
        peak = peaks.get(cfg.bench.peak_window) or max(peaks.values())
        mean = arrivals.mean_rate_rps
        found = carry_to_workload(
            model.deployment.engine,
            model,
            work,
            SLO,
            kv_tokens=KV_TOKENS,
            gpu_hour_usd=GPU_HOUR_USD,
            peak_rate_rps=peak,
            mean_rate_rps=mean,
            config=CONFIG,
        )
        result = capacity_result(
            cfg.require_workload().name,
            SLO,
            work,
            [found],
            CONFIG,
            peak_rate_rps=peak,
            mean_rate_rps=mean,
        )
        path = layout.root / "capacity" / "capacity.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result.to_json()))
        results.CAPACITY.seal(layout)  # as the capacity stage's write does
        return result

    return write


def decide_on(
    root: Path,
    frame: pl.DataFrame,
    benches: list[Sweep],
    requirements: dict[str, Any] | None = None,
    *,
    previous: Path | None = None,
    capacity: CapacityWriter | None = None,
    figures: bool = True,
    **config: Any,
) -> DecisionRecord:
    """Write ``frame`` as the workload and each sweep as result files under ``root``, run every
    stage as the configured commands do (``capacity``: the capacity stage's stand-in), then
    decide. ``figures=False``: the stages draw no SVG figures (no decision reads them, and
    drawing them is most of a scenario's time); the report needs them."""
    with no_figures() if not figures else nullcontext():
        return _decide_on(root, frame, benches, requirements, previous, capacity, config)


@contextmanager
def no_figures() -> Iterator[None]:
    """The stages draw no SVG figures while this lasts (each writes an empty stand-in): for
    tests of what a decision reads, which no figure is."""
    with ExitStack() as stack:
        for stage, name in _FIGURES:
            stack.enter_context(patch.object(stage, name, _NO_FIGURES[name]))
        yield


# Where each stage draws its figures: shape's and bench's figures(), prefix's curve_svg(), and
# the simulation's write_figures() (its figures are their own sealed result).
_FIGURES = (
    (shape_stage, "figures"),
    (prefix_stage, "curve_svg"),
    (sim_stage, "write_figures"),
    (bench_stage, "figures"),
)
_NO_FIGURES: dict[str, Callable[..., Any]] = {
    "figures": lambda *_: {},
    "curve_svg": lambda _: b"",
    "write_figures": lambda _: {},
}


def _decide_on(
    root: Path,
    frame: pl.DataFrame,
    benches: list[Sweep],
    requirements: dict[str, Any] | None,
    previous: Path | None,
    capacity: CapacityWriter | None,
    config: dict[str, Any],
) -> DecisionRecord:
    results = [
        b.write(root / "bench-results" / f"{n}-{b.engine}", session=n)
        for n, b in enumerate(benches)
    ]
    cfg = configuration(root, requirements, results=results, **config)
    layout = cfg.layout()
    write_requests(frame, layout.root)
    shape_stage.write(shape_stage.run(shape_stage.read_inputs(layout), cfg.shape), layout)
    prefix_stage.write(prefix_stage.run(prefix_stage.read_inputs(layout), cfg.prefix), layout)
    sim_inputs = sim_stage.read_inputs(layout, cfg.simulation.latency(cfg.shape.latency))
    sim_stage.write(sim_stage.run(sim_inputs, cfg.simulation), layout)
    bench_stage.run_configured(layout, cfg.bench, cfg.shape.latency)
    if capacity is not None:
        capacity(layout, cfg)
    inputs = configured_inputs(cfg, previous)
    record = decision_stage.run(inputs, cfg.requirements, cfg.decision)
    decision_stage.write(record, layout)
    return record


def statuses(record: DecisionRecord) -> dict[str, str]:
    return {c.engine: c.status for c in record.candidates}


def rule(record: DecisionRecord, name: str) -> Any:
    return next(r for r in record.rationale if r.rule == name)


def candidate(record: DecisionRecord, engine: str) -> Any:
    return next(c for c in record.candidates if c.engine == engine)
