"""Prefix-cache and routing replay as Dagster assets (logic: :mod:`pipeline.sim.stage`).

- ``simulation_scenarios``: a graph asset that fans the configured scenario grid out as one
  dynamic step per scenario (so the multiprocess executor runs them in parallel) and collects
  the summaries into ``simulation/scenarios.parquet``, ``replicas.parquet`` and ``scenarios.json``;
- ``simulation_curves``: hit ratio at every capacity (one stack-distance pass per block size,
  replica count and cache-independent routing) in ``simulation/curves.parquet``;
- ``simulation_plots``: hit ratio vs capacity per routing, and load imbalance vs hit ratio.
"""

from dataclasses import asdict, dataclass
from typing import Any

import dagster as dg
import polars as pl
from dagster import OpExecutionContext

from assets.inputs import step_deps
from assets.metadata import (
    CHECK_PRIORITY,
    SCENARIO_PRIORITY,
    STAGE_PRIORITY,
    check_result,
    md,
    path_entries,
)
from assets.resources import EnginefitStore
from pipeline.sim import checks, compute, stage
from pipeline.sim.config import Scenario
from pipeline.sim.present import curves_table, scenarios_table
from pipeline.sim.result import ScenarioSummary

SCENARIOS_DEPS = step_deps(stage.SCENARIOS_STEP)


@dg.op(
    ins={key: dg.In(dg.Nothing) for key in SCENARIOS_DEPS},
    out=dg.DynamicOut(list),
    tags=SCENARIO_PRIORITY,
)
def sim_plan(store: EnginefitStore, **upstream: Any) -> Any:
    """One dynamic output per group of scenarios replayed together
    (:func:`pipeline.sim.stage.scenario_groups`): a scenario each, keyed by its key, or every
    scenario in one pass over a table too large to flatten."""
    config = store.config()
    for group in stage.scenario_groups(config.layout(), config.simulation):
        key = group[0].key if len(group) == 1 else "every_scenario"
        yield dg.DynamicOutput([asdict(s) for s in group], mapping_key=key)


@dataclass(frozen=True)
class ReplayedGroup:
    """A group's summaries, and what its replay resumed (:func:`stage.resume_note`)."""

    summaries: list[ScenarioSummary]
    resumed: str | None


@dg.op(tags=SCENARIO_PRIORITY)
def sim_scenario(store: EnginefitStore, group: list[dict[str, Any]]) -> ReplayedGroup:
    """Replay a group of scenarios and write each summary JSON under simulation/scenarios/
    (a quarter streamed by days resumes after the days replayed before)."""
    config = store.config()
    layout = config.layout()
    settings = config.simulation
    inputs = stage.scenario_inputs(layout, settings, settings.latency(config.shape.latency))
    summaries = stage.replay(inputs, [Scenario(**s) for s in group], settings)
    for summary in summaries:
        stage.write_scenario(summary, layout)
    return ReplayedGroup(summaries, stage.resume_note(inputs))


@dg.op
def sim_collect(
    context: OpExecutionContext, store: EnginefitStore, groups: list[ReplayedGroup]
) -> dict[str, Any]:
    """Gather every scenario into one table (sorted by scenario key) plus per-replica rows."""
    paths = stage.write_scenarios([s for g in groups for s in g.summaries], store.layout())
    scenarios = pl.read_parquet(paths["scenarios"])
    resumed = [g.resumed for g in groups if g.resumed is not None]
    context.add_output_metadata(
        {
            "dagster/row_count": scenarios.height,
            "scenarios": md(scenarios_table(scenarios)),
            **({"resumed": resumed[0]} if resumed else {}),
            **path_entries(paths),
        }
    )
    return {"scenarios": scenarios.height, "path": str(paths["scenarios"])}


@dg.graph_asset(
    name=stage.SCENARIOS_STEP.asset,
    ins={key: dg.AssetIn(key, dagster_type=dg.Nothing) for key in SCENARIOS_DEPS},
    group_name="simulation",
)
def simulation_scenarios(**upstream: Any) -> Any:
    """The configured grid (block sizes × replicas × capacities × routings), one step per
    scenario: prompt tokens, hit tokens and ratio (durations lifetime, with the instant figures
    beside), prefill computed, per-replica load and max/mean imbalance, spills, warnings."""
    return sim_collect(sim_plan(**upstream).map(sim_scenario).collect())


@dg.asset(
    key=stage.CURVES_STEP.asset,
    deps=step_deps(stage.CURVES_STEP),
    group_name="simulation",
    kinds={"numba", "parquet"},
    op_tags=STAGE_PRIORITY,
)
def simulation_curves(store: EnginefitStore) -> dg.MaterializeResult:  # type: ignore[type-arg]
    """Hit ratio at every per-replica cache capacity (instant lifetime), from one exact LRU
    stack-distance pass per block size × replica count × cache-independent routing (a SHARDS
    sample, its rate and estimated error stated, past ``simulation.curve_exact_max_blocks``)."""
    config = store.config()
    layout = config.layout()
    settings = config.simulation
    curved = stage.curves(layout, settings, settings.latency(config.shape.latency))
    points = compute.curve_points(curved.curves)
    paths = stage.write_curves(curved.curves, points, layout)
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": pl.read_parquet(paths["curves"]).height,
            "curves": md(curves_table(points)),
            **({"resumed": curved.resumed} if curved.resumed else {}),
            **path_entries(paths),
        }
    )


@dg.asset(
    key=stage.FIGURES_STEP.asset,
    deps=step_deps(stage.FIGURES_STEP),
    group_name="simulation",
    kinds={"svg"},
)
def simulation_plots(store: EnginefitStore) -> dg.MaterializeResult:  # type: ignore[type-arg]
    """Hit ratio vs capacity per routing, and load imbalance vs hit ratio per routing (SVG)."""
    return dg.MaterializeResult(metadata=path_entries(stage.write_figures(store.layout())))


@dg.asset_check(
    op_tags=CHECK_PRIORITY,
    asset=simulation_plots,
    description="Every cache-independent scenario's instant-lifetime hits equal the one-pass "
    "curve at its capacity, or lie within a sampled curve's stated error (unknown hits, for a "
    "trace without prompt content, agree only with unknown).",
)
def curve_matches_replay(store: EnginefitStore) -> dg.AssetCheckResult:
    config = store.config()
    paths = config.layout().simulation
    return check_result(
        checks.curve_matches_replay(
            pl.read_parquet(paths.curves),
            pl.read_parquet(paths.scenarios),
            config.simulation.tenant_isolation,
        )
    )


ASSETS = [simulation_scenarios, simulation_curves, simulation_plots]
CHECKS = [curve_matches_replay]
