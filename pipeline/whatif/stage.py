"""The what-if stage, shared by the ``decision_map`` asset and ``enginefit whatif``.

read → run → write:

* :func:`read_inputs` reads what the decision reads (:func:`pipeline.decision.stage.read_inputs`,
  the same report date as ``enginefit decide``; no previous quarter's record), after the
  decision has been written (the stages it reads have run). The report reads the result but
  does not count it among the outputs a version is made from: it is a function of the same
  inputs as the decision, and a later ``enginefit whatif --map ...`` must not fail an audit.
  A scenario with an SLO of its own re-runs the bench analysis (with the bench section, at that
  SLO) and the capacity search (with the settings its result records) in memory.
* :func:`run` re-runs the decision on each configured scenario and over the map's grid
  (:mod:`pipeline.whatif.compute`).
* :func:`write` writes ``whatif/whatif.json`` and the map's figure ``decision_map.svg``;
  :func:`read_result` reads the result back.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from pipeline import results
from pipeline.bench import stage as bench_stage
from pipeline.bench.config import BenchConfig, slo_from_mapping
from pipeline.capacity import stage as capacity_stage
from pipeline.capacity.config import CapacityConfig, ReplayBasis, ServedModel
from pipeline.decision import stage as decision_stage
from pipeline.decision.config import DecisionConfig, Requirements
from pipeline.decision.context import DecisionInputs
from pipeline.layout import WorkloadLayout
from pipeline.safe_read import read_json
from pipeline.store import open_stage_output, write_bytes_atomic, write_json_atomic
from pipeline.whatif.compute import WhatifInputs, whatif
from pipeline.whatif.config import WhatifConfig, map_pair
from pipeline.whatif.present import map_svg
from pipeline.whatif.result import WhatifResult

# What the decision reads, the load points a scenario's SLO re-runs the bench analysis on, and
# the decision itself; the sections of the stages it re-runs with them.
STEP = results.Step(
    results.WHATIF,
    upstream=(*decision_stage.STEP.upstream, results.LOAD_POINTS, results.DECISION),
    sections=("whatif", "decision", "requirements", "bench", "simulation", "shape"),
)


def read_inputs(
    layout: WorkloadLayout,
    settings: WhatifConfig,
    *,
    decision: DecisionConfig,
    requirements: Requirements,
    bench: BenchConfig,
    replay: ReplayBasis,
) -> WhatifInputs:
    """What the decision reads, without a previous quarter's record: a what-if is about this
    quarter's inputs moved, so its result depends on them alone (not on the reports published
    before it). ``decision``, ``requirements`` and ``bench``: the sections of the decision and
    of the bench analysis it re-runs; ``replay``: how the capacity search it re-runs replays
    the fleet's cache."""
    results.DECISION.require(layout)
    inputs = decision_stage.read_inputs(layout, decision, bench.policy())
    served = requirements.served_model()
    at_slo = {
        name: at_another_slo(layout, bench, served, replay, inputs, changes.slo)
        for name, changes in sorted(settings.scenarios.items())
        if changes.slo is not None
    }
    return WhatifInputs(inputs, requirements, decision, at_slo)


def at_another_slo(
    layout: WorkloadLayout,
    bench: BenchConfig,
    served: ServedModel,
    replay: ReplayBasis,
    inputs: DecisionInputs,
    limits: dict[str, Any],
) -> DecisionInputs:
    """The decision's inputs at another SLO: the bench analysis and the capacity search re-run
    in memory on the stored load points (nothing written)."""
    slo = slo_from_mapping(limits, where="whatif scenario slo", base=bench.slo)
    analysis = bench_stage.run(
        bench_stage.read_inputs(layout, inputs.as_of), bench.replace(slo=slo)
    )
    capacity = None
    if inputs.capacity is not None:
        settings = CapacityConfig.model_validate(inputs.capacity.settings)
        searched = capacity_stage.inputs_from(
            layout, analysis, served, inputs.catalog, replay, keep_passes=False
        )
        capacity = capacity_stage.run(searched, settings)
    return replace(inputs, bench=analysis, capacity=capacity)


def run(
    inputs: WhatifInputs,
    settings: WhatifConfig,
    *,
    scenario: str | None = None,
    axes: str | None = None,
) -> WhatifResult:
    """Every scenario (``scenario``: that one, a name of ``settings.scenarios``) and the map
    (``axes``: ``X,Y``, else the configured pair)."""
    pair = map_pair(settings.map, axes) if axes is not None else None
    return whatif(inputs, settings, only=scenario, pair=pair)


def write(result: WhatifResult, layout: WorkloadLayout) -> dict[str, Path]:
    """The result and, with a map, its figure (a map not drawn leaves no stale figure)."""
    open_stage_output(layout)
    paths = layout.whatif
    write_json_atomic(paths.result, result.to_json())
    written = {"result": paths.result}
    if result.map is None:
        paths.map_svg.unlink(missing_ok=True)
    else:
        write_bytes_atomic(paths.map_svg, map_svg(result.map))
        written["map_svg"] = paths.map_svg
    results.WHATIF.seal(layout, written.values())
    return written


def read_result(layout: WorkloadLayout) -> WhatifResult:
    path = results.WHATIF.require(layout)
    return WhatifResult.from_json(read_json(path), str(path))
