"""What-if as an asset (logic: :mod:`pipeline.whatif.stage`).

- ``decision_map``: the decision re-run on each configured scenario and over the map's grid
  (``whatif`` section), written as ``whatif/whatif.json``.
"""

from __future__ import annotations

import dagster as dg

from assets.inputs import step_deps
from assets.metadata import CHECK_PRIORITY, check_result, md, path_entries
from assets.resources import EnginefitStore
from pipeline.commands.whatif import configured_inputs
from pipeline.present.tables import markdown_table
from pipeline.whatif import checks, stage


@dg.asset(key=stage.STEP.asset, deps=step_deps(stage.STEP), group_name="decision", kinds={"json"})
def decision_map(store: EnginefitStore) -> dg.MaterializeResult:  # type: ignore[type-arg]
    """Where each engine wins: the decision over a grid of two axes (default traffic × model
    changes a quarter) and on each named what-if scenario, recomputed (docs/whatif.md)."""
    config = store.config()
    result = stage.run(configured_inputs(config), config.whatif)
    paths = stage.write(result, config.layout())
    rows = [
        {
            "scenario": s.name,
            "engine": s.engine_name or "none",
            "confidence": s.confidence,
            "against today": "; ".join(s.against_today) or "the same decision",
        }
        for s in result.scenarios
    ]
    found = result.map
    metadata: dict[str, dg.MetadataValue | str | int] = {  # type: ignore[type-arg]
        "today_engine": result.today_engine or "none",
        "scenarios": md(markdown_table(rows)) if rows else "none configured",
        **path_entries(paths),
    }
    if found is not None:
        metadata |= {
            "map_axes": f"{found.x.axis} × {found.y.axis}",
            "map_decisions": found.decisions,
            "map_engines": ", ".join(found.engines.values()) or "none",
        }
    return dg.MaterializeResult(metadata=metadata)


@dg.asset_check(
    op_tags=CHECK_PRIORITY,
    asset=decision_map,
    description="One cell and tie flag per grid point, and a scenario without changes "
    "gives today's decision.",
)
def decision_map_consistent(store: EnginefitStore) -> dg.AssetCheckResult:
    return check_result(checks.run_checks(stage.read_result(store.layout())))


ASSETS = [decision_map]
CHECKS = [decision_map_consistent]
