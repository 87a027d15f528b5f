"""``simulation.compare_isolation``: every scenario replayed with a shared cache and with one
namespace per tenant; the curve check compares the scenarios replayed as the curves were."""

from __future__ import annotations

import polars as pl

from pipeline.sim import checks
from pipeline.sim.blocks import sim_input
from pipeline.sim.config import SimConfig
from pipeline.sim.result import curves_frame, scenario_frame
from pipeline.sim.stage import run
from tests.conftest import DEFAULTS, sim_settings
from tests.workloads import growing_conversations

GRID = {"block_sizes": (16,), "replicas": (1, 2), "cache_tokens": (64,)}


def _outputs(settings: SimConfig) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Two tenants taking turns in three conversations."""
    frame = growing_conversations(24, 3, extra_tokens=1, output_tokens=4).with_columns(
        tenant=pl.format("t{}", pl.int_range(pl.len()) % 2)
    )
    result = run(sim_input(frame, latency_model=DEFAULTS.shape.latency), settings)
    return curves_frame(result.curves), scenario_frame(result.summaries)


def test_compare_isolation_runs_every_scenario_both_ways() -> None:
    plain = sim_settings(**GRID, routings=("round-robin",))
    both = plain.replace(compare_isolation=True)
    keys = [s.key for s in both.scenarios()]
    assert len(keys) == 2 * len(plain.scenarios()) == 4
    assert [k.endswith("_iso") for k in keys] == [False, True, False, True]


def test_the_curve_check_compares_scenarios_isolated_as_the_curves_are() -> None:
    """Curves replayed with isolation agree with the isolated scenarios; a tampered isolated
    scenario is caught (before, isolated scenarios were never compared)."""
    settings = sim_settings(
        **GRID,
        routings=("round-robin",),
        request_lifetime="instant",
        tenant_isolation=True,
        compare_isolation=True,
    )
    curves, scenarios = _outputs(settings)
    assert checks.curve_matches_replay(curves, scenarios, isolated=True) == []
    tampered = scenarios.with_columns(
        pl.when(pl.col("tenant_isolation"))
        .then(pl.col("hit_tokens_instant") + 16)
        .otherwise(pl.col("hit_tokens_instant"))
        .alias("hit_tokens_instant")
    )
    problems = checks.curve_matches_replay(curves, tampered, isolated=True)
    assert len(problems) == 2 and all("_iso" in p for p in problems)
