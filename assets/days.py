"""Daily partitions of the ingest (logic: :mod:`pipeline.ingest.days`).

Configuration, not code: ``workload.daily_quarter`` (e.g. ``2025-Q1``) in the configuration
file the definitions load (:func:`configured_quarter`) gives them a ``DailyPartitionsDefinition``
over that quarter's UTC days, and then

- ``workload_day`` (partitioned): one day's trace files (``{day}`` in each configured path)
  into ``<workload>/days/<day>/`` (a day without a file is an empty day); a backfill runs the
  days in parallel, a re-run replaces one day only, and the ``ingest_days_schedule`` ingests
  yesterday each morning (off by default);
- ``workload`` (the same key the later stages and the checks read): the union of the days
  ingested so far, published by linking their parts (no copy) and with request ids repeated
  across days quarantined, so everything after it is as before and reads the quarter lazily.

- ``workload_shape_day`` (partitioned, optional): one day's shape counts ahead of the shape
  stage (a backfill counts the days side by side; ``workload_shape`` reads them back).

Unset, the graph is the single ``workload`` asset of :mod:`assets.ingest`.
"""

from pathlib import Path

import dagster as dg
from dagster import AssetExecutionContext

from assets.ingest import ingest_metadata
from assets.inputs import SHAPE_DAY
from assets.metadata import md
from assets.resources import EnginefitStore
from pipeline.commands.common import DEFAULT_CONFIG
from pipeline.config import load_config
from pipeline.ingest import days, stage
from pipeline.shape import stage as shape_stage
from pipeline.store import read_requests


def quarter_partitions(quarter: str) -> dg.DailyPartitionsDefinition:
    """One partition per UTC day of ``quarter`` (``YYYY-Qn``)."""
    start, end = days.quarter_bounds(quarter)
    return dg.DailyPartitionsDefinition(
        start_date=start.isoformat(), end_date=end.isoformat(), timezone="UTC"
    )


def configured_quarter(config_path: str | Path = DEFAULT_CONFIG) -> str | None:
    """``workload.daily_quarter`` of ``config_path`` (default: the store's, ``enginefit.yaml``
    in the code location's working folder); None when there is no such file. Dagster needs
    the partitions when it loads the definitions, before any run reads the configuration, so
    this reads the file then; an invalid file is its one-line ConfigError there."""
    if not Path(config_path).is_file():
        return None
    workload = load_config(config_path).workload
    return workload.daily_quarter if workload else None


def day_assets(partitions: dg.DailyPartitionsDefinition) -> list[dg.AssetsDefinition]:
    """``workload_day`` over ``partitions`` and the ``workload`` that unites its days."""

    @dg.asset(
        name="workload_day",
        partitions_def=partitions,
        group_name="workload",
        kinds={"polars", "parquet"},
    )
    def workload_day(context: AssetExecutionContext, store: EnginefitStore) -> dg.MaterializeResult:  # type: ignore[type-arg]
        """One UTC day of the workload: the configured trace paths with {day} set to the
        partition, read into the canonical table under days/<day>/; a record arriving on
        another day is quarantined (outside_partition), so the days never overlap."""
        day = context.partition_key
        config = store.config()
        result = days.run_day(config.require_workload(), config.base, day, where=config.where)
        paths = days.write_day(result, config.layout(), day)
        metadata = ingest_metadata(result.summary, paths, result.requests)
        metadata["notes"] = md("\n".join(f"- {n}" for n in result.summary.notes) or "none")
        return dg.MaterializeResult(metadata=metadata)

    @dg.asset(name="workload", deps=[workload_day], group_name="workload", kinds={"parquet"})
    def workload(store: EnginefitStore) -> dg.MaterializeResult:  # type: ignore[type-arg]
        """The canonical request table as the union of the days ingested so far (their parts
        linked in day order, not copied), with their quarantines and summaries joined; a
        request whose id an earlier day has is quarantined (duplicate_request_id)."""
        layout = store.layout()
        wanted = partitions.get_partition_keys()
        present = days.ingested_days(layout, wanted)
        union = days.write_union(layout, present)
        missing = [d for d in wanted if d not in set(present)]
        preview = read_requests(layout).head(5).collect()
        metadata = ingest_metadata(stage.read_summary(layout), union.paths, preview)
        metadata |= {
            "days_ingested": len(present),
            "days_missing": md(", ".join(missing) or "none"),
            "days_empty": md(", ".join(union.empty_days) or "none"),
            "request_ids_repeated_across_days": union.repeated_across_days,
        }
        return dg.MaterializeResult(metadata=metadata)

    return [workload_day, workload]


def shape_day_asset(partitions: dg.DailyPartitionsDefinition) -> dg.AssetsDefinition:
    """``workload_shape_day``: one day's shape counts computed ahead of ``workload_shape``,
    which reads them back (:func:`pipeline.shape.stage.count_day`); a backfill of its
    partitions runs the days side by side. Optional: the shape computes what is missing."""

    @dg.asset(
        name=SHAPE_DAY,
        partitions_def=partitions,
        deps=["workload"],
        group_name="shape",
        kinds={"polars", "parquet"},
    )
    def workload_shape_day(
        context: AssetExecutionContext, store: EnginefitStore
    ) -> dg.MaterializeResult:  # type: ignore[type-arg]
        """One UTC day of the workload counted for the shape (requests per second, lengths,
        tenants, models, sessions, …), kept under shape/days/<day>/ by the digest of the day's
        set in the union; nothing when the quarter is small enough to measure whole."""
        note = shape_stage.count_day(store.layout(), context.partition_key)
        return dg.MaterializeResult(metadata={"day_parts": md(note)})

    return workload_shape_day
