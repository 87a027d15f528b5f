"""Prefix-cache and routing replay as Dagster assets (thin layer over pipeline.sim).

- ``simulation_scenarios``: a graph asset that fans the configured scenario grid out as one
  dynamic step per scenario (so the multiprocess executor runs them in parallel) and collects
  the summaries into ``simulation/scenarios.parquet``, ``replicas.parquet`` and ``scenarios.json``;
- ``simulation_curves``: hit ratio at every capacity (one stack-distance pass per block size,
  replica count and cache-independent routing) in ``simulation/curves.parquet``;
- ``simulation_plots``: hit ratio vs capacity per routing, and load imbalance vs hit ratio.
"""

from dataclasses import asdict
from typing import Any

import dagster as dg
import polars as pl
from dagster import OpExecutionContext

from assets.metadata import md
from assets.resources import EnginefitStore
from pipeline.ingest.stage import read_requests
from pipeline.sim import (
    CACHE_INDEPENDENT,
    Scenario,
    SimInput,
    SimulationConfig,
    capacity_curve,
    sim_input,
    simulate,
    summarise,
)
from pipeline.sim.outputs import (
    curve_disagreements,
    curves_frame,
    plot_hit_ratio_vs_capacity,
    plot_imbalance_vs_hit_ratio,
    replica_frame,
    scenario_frame,
)
from pipeline.store import write_bytes_atomic, write_json_atomic, write_parquet_atomic

STAGE = "simulation"


def _config(store: EnginefitStore) -> SimulationConfig:
    return store.config().simulation


def _input(store: EnginefitStore, sim: SimulationConfig) -> SimInput:
    return sim_input(read_requests(store.layout()), latency_model=sim.latency_model)


@dg.op(ins={"workload": dg.In(dg.Nothing)}, out=dg.DynamicOut(dict))
def sim_plan(store: EnginefitStore) -> Any:
    """One dynamic output per configured scenario, keyed by the scenario key."""
    for scenario in _config(store).scenarios():
        yield dg.DynamicOutput(asdict(scenario), mapping_key=scenario.key)


@dg.op
def sim_scenario(store: EnginefitStore, scenario: dict[str, Any]) -> dict[str, Any]:
    """Replay one scenario and write its summary JSON under simulation/scenarios/."""
    sim = _config(store)
    inp = _input(store, sim)
    sc = Scenario(**scenario)
    run = simulate(
        inp,
        sc,
        seed=sim.random_seed,
        margin=sim.bounded_affinity_margin,
        cache_aware=sim.cache_aware,
        request_lifetime=sim.request_lifetime,
        replica_slots=sim.replica_slots,
    )
    summary = summarise(inp, run, pinned_warn_share=sim.pinned_warn_share)
    write_json_atomic(store.layout().simulation.scenario(sc.key), summary)
    return summary


@dg.op
def sim_collect(
    context: OpExecutionContext, store: EnginefitStore, summaries: list[dict[str, Any]]
) -> dict[str, Any]:
    """Gather every scenario into one table (sorted by scenario key) plus per-replica rows."""
    out = store.layout().simulation
    ordered = sorted(summaries, key=lambda s: str(s["scenario"]))
    scenarios = scenario_frame(ordered)
    write_parquet_atomic(scenarios, out.scenarios)
    write_parquet_atomic(replica_frame(ordered), out.replicas)
    write_json_atomic(out.summary, ordered)
    table = scenarios.select(
        "scenario",
        "routing",
        "replicas",
        "cache_tokens",
        "hit_ratio",
        "hit_ratio_instant",
        "token_imbalance",
        "spills",
    )
    context.add_output_metadata(
        {
            "dagster/row_count": scenarios.height,
            "scenarios": md(table),
            "scenarios_path": dg.MetadataValue.path(str(out.scenarios)),
        }
    )
    return {"scenarios": scenarios.height, "path": str(out.scenarios)}


@dg.graph_asset(
    ins={"workload": dg.AssetIn("workload", dagster_type=dg.Nothing)},
    group_name=STAGE,
)
def simulation_scenarios(workload: Any) -> Any:
    """The configured grid (block sizes × replicas × capacities × routings), one step per
    scenario: prompt tokens, hit tokens, hit ratio, prefill computed, per-replica load and
    max/mean imbalance, spills."""
    return sim_collect(sim_plan(workload).map(sim_scenario).collect())


@dg.asset(deps=["workload"], group_name=STAGE, kinds={"numba", "parquet"})
def simulation_curves(store: EnginefitStore) -> dg.MaterializeResult:  # type: ignore[type-arg]
    """Hit ratio at every per-replica cache capacity, from one exact LRU stack-distance pass per
    block size × replica count × cache-independent routing (and one replica per block size)."""
    sim = _config(store)
    inp = _input(store, sim)
    curves = []
    points: list[dict[str, Any]] = []
    for bs in sim.block_sizes:
        combos = [(1, "round-robin")] + [
            (r, p) for r in sim.replicas if r > 1 for p in sim.routings if p in CACHE_INDEPENDENT
        ]
        for replicas, routing in combos:
            curve = capacity_curve(
                inp,
                block_size=bs,
                replicas=replicas,
                routing=routing,
                tenant_isolation=sim.tenant_isolation,
                seed=sim.random_seed,
                margin=sim.bounded_affinity_margin,
                replica_slots=sim.replica_slots,
            )
            curves.append(curve)
            points.append(curve.as_dict(sim.curve_points))
    out = store.layout().simulation
    frame = curves_frame(curves)
    write_parquet_atomic(frame, out.curves)
    write_json_atomic(out.curves_json, points)
    summary = pl.DataFrame(
        [
            {
                "block_size": p["block_size"],
                "replicas": p["replicas"],
                "routing": p["routing"],
                "max_hit_ratio": p["max_hit_ratio"],
                "saturation_cache_tokens": p["saturation_cache_tokens"],
            }
            for p in points
        ]
    )
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": frame.height,
            "curves": md(summary),
            "curves_path": dg.MetadataValue.path(str(out.curves)),
        }
    )


@dg.asset(deps=[simulation_scenarios, simulation_curves], group_name=STAGE, kinds={"svg"})
def simulation_plots(store: EnginefitStore) -> dg.MaterializeResult:  # type: ignore[type-arg]
    """Hit ratio vs capacity per routing, and load imbalance vs hit ratio per routing (SVG)."""
    out = store.layout().simulation
    scenarios = pl.read_parquet(out.scenarios)
    curves = pl.read_parquet(out.curves)
    hit_path = out.hit_ratio_svg
    imb_path = out.imbalance_svg
    write_bytes_atomic(hit_path, plot_hit_ratio_vs_capacity(curves, scenarios))
    write_bytes_atomic(imb_path, plot_imbalance_vs_hit_ratio(scenarios))
    return dg.MaterializeResult(
        metadata={
            "hit_ratio_vs_capacity": dg.MetadataValue.path(str(hit_path)),
            "imbalance_vs_hit_ratio": dg.MetadataValue.path(str(imb_path)),
        }
    )


@dg.asset_check(asset=simulation_plots)
def curve_matches_replay(store: EnginefitStore) -> dg.AssetCheckResult:
    """Every cache-independent scenario's instant-lifetime hits equal the one-pass curve at its
    capacity."""
    out = store.layout().simulation
    bad = curve_disagreements(pl.read_parquet(out.curves), pl.read_parquet(out.scenarios))
    return dg.AssetCheckResult(
        passed=bad.height == 0,
        metadata={"disagreements": md(bad)},
    )


ASSETS = [simulation_scenarios, simulation_curves, simulation_plots]
CHECKS = [curve_matches_replay]
