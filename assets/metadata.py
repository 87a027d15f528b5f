"""Dagster metadata from pipeline results: Markdown, paths, previews and check results.

Tables come from :mod:`pipeline.present.tables`, so the UI shows what the command line prints.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl

from pipeline.present.tables import bullet_list, markdown_table

# The multiprocess executor starts ready steps highest ``dagster/priority`` first (default 0):
# the scenario replays (the longest steps, and the longest path to the report) before the
# stages beside them, and checks (no step waits for them) last, in the gaps. The files of the
# ingest come before all (everything waits for them).
INGEST_PRIORITY = {"dagster/priority": "3"}
SCENARIO_PRIORITY = {"dagster/priority": "2"}
STAGE_PRIORITY = {"dagster/priority": "1"}
CHECK_PRIORITY = {"dagster/priority": "-1"}


def md(frame_or_text: pl.DataFrame | str) -> dg.MetadataValue:
    """Markdown metadata from a frame (via the shared table format) or prepared text."""
    text = frame_or_text if isinstance(frame_or_text, str) else markdown_table(frame_or_text)
    return dg.MetadataValue.md(text)


def path_entries(paths: Mapping[str, Path]) -> dict[str, dg.MetadataValue]:
    """``<name>_path`` → path metadata for every written file, in name order."""
    return {f"{name}_path": dg.MetadataValue.path(str(p)) for name, p in sorted(paths.items())}


def frame_preview(frame: pl.DataFrame, rows: int = 5) -> dg.MetadataValue:
    return _table(frame.head(rows))


def _table(head: pl.DataFrame) -> dg.MetadataValue:
    """``head`` as a table. Apart from :func:`frame_preview` because building the Dagster
    table types keeps a reference to their caller's local variables (seen as the whole
    canonical table, 1.5 GiB at 10M requests, held in a module of dagster's for the rest of
    the run): here they are the few rows shown."""
    records = [
        dg.TableRecord(
            {
                k: v if isinstance(v, int | float | str | bool) or v is None else str(v)
                for k, v in row.items()
            }
        )
        for row in head.to_dicts()
    ]
    schema = dg.TableSchema(
        columns=[dg.TableColumn(name=c, type=str(t)) for c, t in head.schema.items()]
    )
    return dg.MetadataValue.table(records=records, schema=schema)


def check_result(problems: list[str], *, warn: bool = False, **extra: Any) -> dg.AssetCheckResult:
    """A pure predicate's problems (empty = pass) as a check result; ``warn`` for soft checks."""
    return dg.AssetCheckResult(
        passed=not problems,
        severity=dg.AssetCheckSeverity.WARN if warn else dg.AssetCheckSeverity.ERROR,
        metadata={"problems": dg.MetadataValue.md(bullet_list(problems)), **extra},
    )
