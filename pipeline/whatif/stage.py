"""The what-if stage, shared by the ``decision_map`` asset and ``enginefit whatif``.

read → run → write:

* :func:`read_inputs` reads what the decision reads (:func:`pipeline.decision.stage.read_inputs`,
  the same report date as ``enginefit decide``; no previous quarter's record), after the
  decision has been written (the stages it reads have run). The report reads the result but
  does not count it among the outputs a version is made from: it is a function of the same
  inputs as the decision, and a later ``enginefit whatif --map ...`` must not fail an audit.
* :func:`run` re-runs the decision on each configured scenario and over the map's grid
  (:mod:`pipeline.whatif.compute`).
* :func:`write` writes ``whatif/whatif.json`` and the map's figure ``decision_map.svg``;
  :func:`read_result` reads the result back.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from pipeline.bench import stage as bench_stage
from pipeline.bench.config import slo_from_mapping
from pipeline.capacity import stage as capacity_stage
from pipeline.capacity.stage import capacity_slo
from pipeline.config import Config
from pipeline.decision import stage as decision_stage
from pipeline.decision.context import DecisionInputs
from pipeline.errors import ConfigError
from pipeline.layout import WorkloadLayout, require_output
from pipeline.safe_read import read_json
from pipeline.store import open_stage_output, write_bytes_atomic, write_json_atomic
from pipeline.whatif.compute import WhatifInputs, whatif
from pipeline.whatif.config import map_pair
from pipeline.whatif.present import map_svg
from pipeline.whatif.result import WhatifResult


def read_inputs(layout: WorkloadLayout, config: Config) -> WhatifInputs:
    """What the decision reads, without a previous quarter's record: a what-if is about this
    quarter's inputs moved, so its result depends on them alone (not on the reports published
    before it)."""
    require_output(layout.decision.record, "decision record", "decide", "engine_decision")
    inputs = replace(
        decision_stage.read_inputs(layout, config, as_of=config.bench.as_of), previous=None
    )
    at_slo = {
        name: at_another_slo(layout, config, inputs, changes.slo)
        for name, changes in sorted(config.whatif.scenarios.items())
        if changes.slo is not None
    }
    return WhatifInputs(inputs, config.requirements, config.decision, at_slo)


def at_another_slo(
    layout: WorkloadLayout, config: Config, inputs: DecisionInputs, limits: dict[str, Any]
) -> DecisionInputs:
    """The decision's inputs at another SLO: the bench analysis and the capacity search re-run
    in memory on the stored load points (nothing written)."""
    slo = slo_from_mapping(limits, where="whatif scenario slo", base=config.bench.slo)
    bench_config = config.bench.replace(slo=slo)
    bench = bench_stage.run(bench_stage.read_inputs(layout, inputs.as_of), bench_config)
    capacity = None
    if inputs.capacity is not None:
        searched = replace(
            capacity_stage.read_inputs(layout, config),
            points=bench.evaluated,
            bench_capacity=bench.capacity,
            slo=capacity_slo(slo),
            min_achieved_rate_share=slo.min_achieved_rate_share,
        )
        capacity = capacity_stage.run(searched, config.capacity)
    return replace(inputs, bench=bench, capacity=capacity)


def run(
    inputs: WhatifInputs,
    config: Config,
    *,
    scenario: str | None = None,
    axes: str | None = None,
) -> WhatifResult:
    """Every scenario (``scenario``: that one) and the map (``axes``: ``X,Y``, else the
    configured pair)."""
    section = config.whatif
    if scenario is not None and scenario not in section.scenarios:
        named = ", ".join(sorted(section.scenarios)) or "none configured"
        raise ConfigError(
            f"--scenario: no scenario {scenario!r} in whatif.scenarios of {config.where} "
            f"(named: {named})"
        )
    pair = map_pair(section.map, axes) if axes is not None else None
    return whatif(inputs, section, only=scenario, pair=pair)


def write(result: WhatifResult, layout: WorkloadLayout) -> dict[str, Path]:
    """The result and, with a map, its figure (a map not drawn leaves no stale figure)."""
    open_stage_output(layout)
    paths = layout.whatif
    write_json_atomic(paths.result, result.to_json())
    if result.map is None:
        paths.map_svg.unlink(missing_ok=True)
        return {"result": paths.result}
    write_bytes_atomic(paths.map_svg, map_svg(result.map))
    return {"result": paths.result, "map_svg": paths.map_svg}


def read_result(layout: WorkloadLayout) -> WhatifResult:
    path = require_output(layout.whatif.result, "what-if result", "whatif", "decision_map")
    return WhatifResult.from_json(read_json(path), str(path))
