"""The simulation's pure computation: a scenario's summary and the capacity curves, from the
flattened workload (:class:`pipeline.sim.blocks.SimInputs`) or, for scenarios, the workload
streamed chunk by chunk (:class:`pipeline.sim.stream.RequestStream`), and the stage's
settings; no I/O of its own."""

from __future__ import annotations

from typing import Any

from pipeline.sim.blocks import SimInputs
from pipeline.sim.config import CACHE_INDEPENDENT, Scenario, SimConfig
from pipeline.sim.curve import Curve, capacity_curve
from pipeline.sim.replay import simulate, summarise
from pipeline.sim.result import ScenarioSummary
from pipeline.sim.stream import RequestStream


def scenario_summary(
    inputs: SimInputs | RequestStream, scenario: Scenario, settings: SimConfig
) -> ScenarioSummary:
    """One scenario's replay, summarised: of the flattened table, or streamed through it chunk
    by chunk (:mod:`pipeline.sim.stream`; the same summary, in memory bounded by the caches)."""
    if isinstance(inputs, RequestStream):
        return ScenarioSummary.from_json(inputs.simulate(scenario, settings).summary)
    return ScenarioSummary.from_json(summarise(inputs, simulate(inputs, scenario, settings)))


def curve_combinations(settings: SimConfig) -> list[tuple[int, int, str]]:
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


def capacity_curves(inputs: SimInputs, settings: SimConfig) -> list[Curve]:
    return [
        capacity_curve(inputs, settings, block_size=bs, replicas=replicas, routing=routing)
        for bs, replicas, routing in curve_combinations(settings)
    ]


def curve_points(curves: list[Curve]) -> list[dict[str, Any]]:
    return [curve.as_dict() for curve in curves]
