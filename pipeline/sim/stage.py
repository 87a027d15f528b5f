"""The simulation stage, shared by the ``simulation_*`` assets and ``enginefit simulate``.

read → run → write, split where Dagster fans out: one step per scenario
(:func:`run_scenario` → :func:`write_scenario`), then the collected tables
(:func:`write_scenarios`), the capacity curves (:func:`run_curves` → :func:`write_curves`) and
the figures (:func:`write_figures`, from the written tables). :func:`run` and :func:`write` do
all of it in one process (the command); the files are the same either way. Paths:
:class:`pipeline.layout.SimulationPaths`.

What every scenario and curve of a workload needs is worked out once per process and shared:
:func:`read_inputs` keeps the last workload it flattened (keyed by the canonical table's files
and the latency model, in :mod:`pipeline.sim.memo`, let go of by a later stage's large read), and
that :class:`SimInput` keeps its dense block ids per block size and its sessions once a
scenario has asked for them. So the command, and a Dagster run whose steps
share a process (``enginefit report``'s default in-process executor), flatten the table, number
its blocks and infer its sessions once, not once per scenario step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.config import Config
from pipeline.ingest.stage import read_requests
from pipeline.layout import WorkloadLayout, require_output
from pipeline.shape.facts import LatencyModel
from pipeline.sim import memo
from pipeline.sim.blocks import SimInput, sim_input
from pipeline.sim.config import CACHE_INDEPENDENT, Scenario, SimulationConfig
from pipeline.sim.curve import Curve, capacity_curve
from pipeline.sim.present import hit_ratio_vs_capacity_svg, imbalance_vs_hit_ratio_svg
from pipeline.sim.replay import simulate, summarise
from pipeline.sim.result import curves_frame, replica_frame, scenario_frame
from pipeline.store import (
    open_stage_output,
    write_bytes_atomic,
    write_json_atomic,
    write_parquet_atomic,
)


def _table_key(layout: WorkloadLayout, latency: LatencyModel) -> tuple[Any, ...]:
    """What a flattened table depends on: its part files (path, inode, size, modification
    time, so a rewritten part is a new key) and the latency model of its durations."""
    files = []
    for part in layout.ingest.parts():
        stat = part.stat()
        files.append((str(part.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns))
    return (tuple(files), latency)


def read_inputs(layout: WorkloadLayout, config: Config) -> SimInput:
    """The canonical table flattened for replay, with the latency model durations come from
    (``simulation.latency_model``, else ``shape.latency_model``); the same object as the last
    call's when the table's files and the latency model are unchanged (the module docstring)."""
    latency = config.simulation.latency(config.shape.latency)
    requests = read_requests(layout)  # checks the table against its ingest manifest
    key = ("simulation", *_table_key(layout, latency))
    return memo.reuse(key, lambda: sim_input(requests, latency_model=latency))


def plan(settings: SimulationConfig) -> list[Scenario]:
    return settings.scenarios()


def run_scenario(
    inputs: SimInput, scenario: Scenario, settings: SimulationConfig
) -> dict[str, Any]:
    """One scenario's summary (JSON-ready)."""
    return summarise(inputs, simulate(inputs, scenario, settings))


def write_scenario(summary: dict[str, Any], layout: WorkloadLayout) -> Path:
    open_stage_output(layout)
    path = layout.simulation.scenario(str(summary["scenario"]))
    write_json_atomic(path, summary)
    return path


def write_scenarios(summaries: list[dict[str, Any]], layout: WorkloadLayout) -> dict[str, Path]:
    """Every scenario in one table (sorted by key), per-replica rows, and the summaries."""
    open_stage_output(layout)
    paths = layout.simulation
    ordered = sorted(summaries, key=lambda s: str(s["scenario"]))
    write_parquet_atomic(scenario_frame(ordered), paths.scenarios)
    write_parquet_atomic(replica_frame(ordered), paths.replicas)
    write_json_atomic(paths.summary, ordered)
    return {"scenarios": paths.scenarios, "replicas": paths.replicas, "summary": paths.summary}


def curve_combinations(settings: SimulationConfig) -> list[tuple[int, int, str]]:
    """(block size, replicas, routing) of every curve: one replica per block size, and each
    multi-replica count with each routing that does not read cache state."""
    return [
        (bs, replicas, routing)
        for bs in settings.block_sizes
        for replicas, routing in [
            (1, "round-robin"),
            *(
                (r, p)
                for r in settings.replicas
                if r > 1
                for p in settings.routings
                if p in CACHE_INDEPENDENT
            ),
        ]
    ]


def run_curves(inputs: SimInput, settings: SimulationConfig) -> list[Curve]:
    return [
        capacity_curve(inputs, settings, block_size=bs, replicas=replicas, routing=routing)
        for bs, replicas, routing in curve_combinations(settings)
    ]


def curve_points(curves: list[Curve]) -> list[dict[str, Any]]:
    return [curve.as_dict() for curve in curves]


def write_curves(curves: list[Curve], layout: WorkloadLayout) -> dict[str, Path]:
    open_stage_output(layout)
    paths = layout.simulation
    write_parquet_atomic(curves_frame(curves), paths.curves)
    write_json_atomic(paths.curves_json, curve_points(curves))
    return {"curves": paths.curves, "curves_json": paths.curves_json}


def write_figures(layout: WorkloadLayout) -> dict[str, Path]:
    """The figures, drawn from the written scenario and curve tables."""
    open_stage_output(layout)
    paths = layout.simulation
    scenarios = pl.read_parquet(paths.scenarios)
    curves = pl.read_parquet(paths.curves)
    write_bytes_atomic(paths.hit_ratio_svg, hit_ratio_vs_capacity_svg(curves, scenarios))
    write_bytes_atomic(paths.imbalance_svg, imbalance_vs_hit_ratio_svg(scenarios))
    return {"hit_ratio_svg": paths.hit_ratio_svg, "imbalance_svg": paths.imbalance_svg}


@dataclass(frozen=True)
class SimulationResult:
    summaries: list[dict[str, Any]]
    curves: list[Curve]


def run(inputs: SimInput, settings: SimulationConfig) -> SimulationResult:
    """Every configured scenario and curve, one after another (the command's path)."""
    return SimulationResult(
        [run_scenario(inputs, scenario, settings) for scenario in plan(settings)],
        run_curves(inputs, settings),
    )


def write(
    result: SimulationResult, settings: SimulationConfig, layout: WorkloadLayout
) -> dict[str, Path]:
    written = {f"scenario_{s['scenario']}": write_scenario(s, layout) for s in result.summaries}
    written |= write_scenarios(result.summaries, layout)
    written |= write_curves(result.curves, layout)
    written |= write_figures(layout)
    return written


def read_summaries(layout: WorkloadLayout) -> list[dict[str, Any]]:
    """The collected scenario summaries (what later stages read)."""
    path = require_output(
        layout.simulation.summary, "simulation results", "simulate", "simulation_scenarios"
    )
    summaries: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))
    return summaries


def read_curves(layout: WorkloadLayout) -> pl.DataFrame:
    """Every step of every written capacity curve (what later stages read)."""
    path = require_output(
        layout.simulation.curves, "capacity curves", "simulate", "simulation_curves"
    )
    return pl.read_parquet(path)
