"""Daily partitions of the ingest (logic: :mod:`pipeline.ingest.days`).

Configuration, not code: the environment variable ``ENGINEFIT_DAILY_QUARTER`` (e.g. ``2025-Q1``)
gives the definitions a ``DailyPartitionsDefinition`` over that quarter's UTC days, and then

- ``workload_day`` (partitioned): one day's trace files (``{day}`` in each configured path)
  into ``<workload>/days/<day>/``; a backfill runs the days in parallel, a re-run replaces one
  day only, and the ``ingest_days_schedule`` ingests yesterday each morning (off by default);
- ``workload`` (the same key the later stages and the checks read): the union of the days
  ingested so far, published by linking their parts (no copy), so everything after it is as
  before and reads the quarter lazily.

Unset, the graph is the single ``workload`` asset of :mod:`assets.ingest`.
"""

import os

import dagster as dg
import polars as pl
from dagster import AssetExecutionContext

from assets.ingest import ingest_metadata
from assets.metadata import md
from assets.resources import EnginefitStore
from pipeline.ingest import days, stage

DAILY_ENV = "ENGINEFIT_DAILY_QUARTER"


def quarter_partitions(quarter: str) -> dg.DailyPartitionsDefinition:
    """One partition per UTC day of ``quarter`` (``YYYY-Qn``)."""
    start, end = days.quarter_bounds(quarter)
    return dg.DailyPartitionsDefinition(
        start_date=start.isoformat(), end_date=end.isoformat(), timezone="UTC"
    )


def configured_quarter() -> str | None:
    return os.environ.get(DAILY_ENV) or None


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
        result = days.run_day(config, day)
        paths = days.write_day(result, config.layout(), day)
        return dg.MaterializeResult(
            metadata=ingest_metadata(result.summary, paths, result.requests)
        )

    @dg.asset(name="workload", deps=[workload_day], group_name="workload", kinds={"parquet"})
    def workload(store: EnginefitStore) -> dg.MaterializeResult:  # type: ignore[type-arg]
        """The canonical request table as the union of the days ingested so far (their parts
        linked in day order, not copied), with their quarantines and summaries joined."""
        layout = store.layout()
        wanted = partitions.get_partition_keys()
        present = days.ingested_days(layout, wanted)
        paths = days.write_union(layout, present)
        missing = [d for d in wanted if d not in set(present)]
        requests = stage.read_requests(layout)
        duplicated = requests.select(pl.len() - pl.col("request_id").n_unique()).collect().item()
        metadata = ingest_metadata(stage.read_summary(layout), paths, requests.head(5).collect())
        metadata |= {
            "days_ingested": len(present),
            "days_missing": md(", ".join(missing) or "none"),
            "request_ids_repeated_across_days": int(duplicated),
        }
        return dg.MaterializeResult(metadata=metadata)

    return [workload_day, workload]
