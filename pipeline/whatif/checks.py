"""Pure predicates over a what-if result; each returns the problems it found (empty: fine)."""

from __future__ import annotations

from pipeline.whatif.result import WhatifResult


def map_is_complete(result: WhatifResult) -> list[str]:
    """One cell and one tie flag per grid point, each engine named."""
    found = result.map
    if found is None:
        return []
    rows, columns = len(found.y.values), len(found.x.values)
    problems = []
    if len(found.cells) != rows or any(len(r) != columns for r in found.cells):
        problems.append(f"the map's cells are not {rows} × {columns}")
    if len(found.ties) != rows or any(len(r) != columns for r in found.ties):
        problems.append(f"the map's tie flags are not {rows} × {columns}")
    unnamed = {e for row in found.cells for e in row if e} - set(found.engines)
    if unnamed:
        problems.append(f"engines on the map without a name: {sorted(unnamed)}")
    return problems


def unchanged_scenarios_agree(result: WhatifResult) -> list[str]:
    """A scenario that changes nothing gives today's engine and says nothing changed."""
    return [
        f"scenario {s.name} changes nothing but gives {s.engine} against today's "
        f"{result.today_engine}"
        for s in result.scenarios
        if not s.changes and (s.engine != result.today_engine or s.against_today)
    ]


ALL_CHECKS = (map_is_complete, unchanged_scenarios_agree)


def run_checks(result: WhatifResult) -> list[str]:
    return [problem for check in ALL_CHECKS for problem in check(result)]
