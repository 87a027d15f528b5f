"""Ingest one UTC day at a time, and the workload as the union of its days.

A quarter of traces is usually exported a file (or a few) per day. With daily partitions
(``assets/days.py``) each day is ingested on its own, from the configured trace paths with
``{day}`` replaced by the day (``traces/requests-{day}.jsonl`` → ``traces/requests-2025-01-05.jsonl``),
into ``<workload>/days/<day>/``: a complete ingest set (parts, quarantine, summary, manifest;
:mod:`pipeline.store`). A record that does not arrive on its partition's day is quarantined
(``outside_partition``), so the days never overlap and, taken in order, stay sorted by arrival.

The workload itself is then the union: its ``requests/`` holds hard links to every day's parts
(no copy; each later stage scans them lazily as before), its quarantine and summary are the
days' together, and its manifest is written last, as for a single ingest. Re-ingesting a day
replaces that day's set only; the union is published again from the days as they are.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Sequence
from pathlib import Path

import polars as pl

from pipeline.config import Config
from pipeline.errors import ConfigError
from pipeline.ingest import stage
from pipeline.ingest.result import FileSummary, IngestResult, IngestSummary
from pipeline.layout import WorkloadLayout
from pipeline.schema import QUARANTINE_SCHEMA, empty_quarantine
from pipeline.store import open_stage_output, publish_ingest, sha256_file, verify_ingest

DAY_FIELD = "{day}"
OUTSIDE = "outside_partition"
_DAY_NAME = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def parse_day(day: str) -> dt.date:
    try:
        return dt.date.fromisoformat(day)
    except ValueError as exc:
        raise ConfigError(f"{day!r}: not a day (YYYY-MM-DD)") from exc


def day_window(day: str) -> tuple[dt.datetime, dt.datetime]:
    """[start, end) of the UTC day ``day`` (YYYY-MM-DD)."""
    start = dt.datetime.combine(parse_day(day), dt.time(), tzinfo=dt.UTC)
    return start, start + dt.timedelta(days=1)


def quarter_bounds(quarter: str) -> tuple[dt.date, dt.date]:
    """[first day, first day of the next quarter) of ``YYYY-Qn``."""
    year, _, number = quarter.partition("-Q")
    if not (year.isdigit() and number in ("1", "2", "3", "4")):
        raise ConfigError(f"{quarter!r}: not a quarter (YYYY-Qn, e.g. 2025-Q1)")
    first_month = 3 * (int(number) - 1) + 1
    start = dt.date(int(year), first_month, 1)
    end = dt.date(int(year) + first_month // 10, (first_month + 2) % 12 + 1, 1)
    return start, end


def day_config(config: Config, day: str) -> Config:
    """``config`` with ``{day}`` in each trace path replaced by ``day``; every path must have
    it (a path without it would be read again by every day)."""
    parse_day(day)
    workload = config.require_workload()
    plain = [t for t in workload.traces if DAY_FIELD not in t.path]
    if plain:
        raise ConfigError(
            f"{config.where}: workload.traces: {plain[0].display} has no {DAY_FIELD}: with daily "
            f"partitions every trace path names its day, e.g. traces/requests-{DAY_FIELD}.jsonl"
        )
    traces = tuple(
        t.replace(path=t.path.replace(DAY_FIELD, day), label=t.label.replace(DAY_FIELD, day))
        for t in workload.traces
    )
    return dataclasses.replace(config, workload=workload.replace(traces=traces))


def _counts(quarantine: pl.DataFrame) -> dict[str, int]:
    counts = quarantine.group_by("reason").len().sort("reason")
    return dict(zip(counts["reason"].to_list(), counts["len"].to_list(), strict=True))


def restrict_to_day(result: IngestResult, day: str) -> IngestResult:
    """Keep the requests arriving on ``day`` (UTC); quarantine the others as
    ``outside_partition``, with every count reconciled again."""
    start, end = day_window(day)
    requests = result.requests
    inside = (pl.col("arrival") >= start) & (pl.col("arrival") < end)
    outside = requests.filter(~inside)
    if not outside.height:
        return result
    kept = requests.filter(inside)
    moved = outside.select(
        "source_file",
        "source_line",
        pl.lit("arrival").alias("field"),
        pl.lit(OUTSIDE).alias("reason"),
        pl.format("arrives {}, outside the partition's day " + day, pl.col("arrival")).alias(
            "detail"
        ),
    ).cast(QUARANTINE_SCHEMA)
    quarantine = pl.concat([result.quarantine, moved]).sort(["source_file", "source_line"])
    summary = result.summary
    files = []
    for f in summary.files:
        n = moved.filter(pl.col("source_file") == f.file).height
        by_reason = dict(f.quarantined_by_reason)
        if n:
            by_reason[OUTSIDE] = n
        files.append(
            dataclasses.replace(
                f,
                ingested=f.ingested - n,
                quarantined=f.quarantined + n,
                quarantined_by_reason=dict(sorted(by_reason.items())),
            )
        )
    first = kept["arrival"].min() if kept.height else None
    last = kept["arrival"].max() if kept.height else None
    restricted = dataclasses.replace(
        summary,
        files=files,
        ingested=kept.height,
        quarantined=quarantine.height,
        quarantined_by_reason=_counts(quarantine),
        duplicate_timestamps=kept.height - kept["arrival"].n_unique(),
        first_arrival=first.isoformat() if isinstance(first, dt.datetime) else None,
        last_arrival=last.isoformat() if isinstance(last, dt.datetime) else None,
        span_s=(last - first).total_seconds()
        if isinstance(first, dt.datetime) and isinstance(last, dt.datetime)
        else 0.0,
        notes=[
            *summary.notes,
            f"{outside.height:,} record(s) arrive outside {day} (UTC) and were quarantined as "
            f"{OUTSIDE}: each belongs to the partition of its own day",
        ],
    )
    return IngestResult(kept, quarantine, restricted)


def union_summary(days: Sequence[tuple[str, IngestSummary]]) -> IngestSummary:
    """The workload's summary from its days' (in day order): counts add up (the days are
    disjoint), the first and last arrivals span them, each file is listed once per day."""
    if not days:
        raise ConfigError("no day of the workload has been ingested yet")
    summaries = [s for _, s in days]
    sizes = {s.block_size for s in summaries if s.ingested}
    if len(sizes) > 1:
        raise ConfigError(
            f"the days were ingested with different block sizes ({sorted(sizes)}); "
            "re-ingest them with one configuration"
        )
    by_reason: dict[str, int] = {}
    for s in summaries:
        for reason, n in s.quarantined_by_reason.items():
            by_reason[reason] = by_reason.get(reason, 0) + n
    firsts = [dt.datetime.fromisoformat(s.first_arrival) for s in summaries if s.first_arrival]
    lasts = [dt.datetime.fromisoformat(s.last_arrival) for s in summaries if s.last_arrival]
    first, last = (min(firsts), max(lasts)) if firsts else (None, None)
    base = summaries[-1]
    files: list[FileSummary] = [f for s in summaries for f in s.files]
    return dataclasses.replace(
        base,
        files=files,
        records_read=sum(s.records_read for s in summaries),
        ingested=sum(s.ingested for s in summaries),
        quarantined=sum(s.quarantined for s in summaries),
        quarantined_by_reason=dict(sorted(by_reason.items())),
        out_of_order=sum(s.out_of_order for s in summaries),
        duplicate_timestamps=sum(s.duplicate_timestamps for s in summaries),
        duplicate_request_ids=sum(s.duplicate_request_ids for s in summaries),
        first_arrival=first.isoformat() if first else None,
        last_arrival=last.isoformat() if last else None,
        span_s=(last - first).total_seconds() if first and last else 0.0,
        block_size=sizes.pop() if sizes else base.block_size,
        tokens_approximate=any(s.tokens_approximate for s in summaries),
        prompt_blocks_capped=sum(s.prompt_blocks_capped for s in summaries),
        notes=[f"{day}: {note}" for day, s in days for note in s.notes],
        skipped_files=[f for s in summaries for f in s.skipped_files],
        warnings=sorted({w for s in summaries for w in s.warnings}),
    )


def run_day(config: Config, day: str) -> IngestResult:
    """The records of ``day``'s trace files that arrive on ``day``; the rest quarantined."""
    return restrict_to_day(stage.run(stage.configured_inputs(day_config(config, day))), day)


def write_day(result: IngestResult, layout: WorkloadLayout, day: str) -> dict[str, Path]:
    """Publish one day's set under ``days/<day>/`` (the workload folder marked as enginefit's
    first, so the days may be written side by side)."""
    open_stage_output(layout)
    return stage.write(result, layout.day(day))


def ingested_days(layout: WorkloadLayout, days: Sequence[str] | None = None) -> list[str]:
    """The days with an ingest set on disk (of ``days`` when given), in order."""
    if not layout.days_dir.is_dir():
        return []
    present = sorted(
        p.name for p in layout.days_dir.iterdir() if _DAY_NAME.match(p.name) and p.is_dir()
    )
    return present if days is None else [d for d in present if d in set(days)]


def write_union(layout: WorkloadLayout, days: Sequence[str]) -> dict[str, Path]:
    """Publish the workload's ingest set as the union of ``days`` (each checked against its
    manifest first): their parts linked in day order, their quarantines and summaries joined,
    and the days' manifest digests recorded in the workload's manifest."""
    if not days:
        raise ConfigError(
            f"{layout.days_dir}: no day ingested yet; materialise partitions of workload_day first"
        )
    summaries, quarantines, parts, lineage = [], [], [], {}
    for day in days:
        day_layout = layout.day(day)
        verify_ingest(day_layout)
        summaries.append((day, stage.read_summary(day_layout)))
        quarantine = day_layout.ingest.quarantine
        if quarantine.exists():
            quarantines.append(pl.read_parquet(quarantine))
        parts += day_layout.ingest.parts()
        lineage[day] = sha256_file(day_layout.ingest.manifest)
    summary = union_summary(summaries)
    joined = pl.concat(quarantines) if quarantines else empty_quarantine()
    paths = layout.ingest
    linked = publish_ingest(
        layout,
        [],
        joined.sort(["source_file", "source_line"]),
        summary.to_json(),
        linked_parts=parts,
        extra={"days": lineage},
    )
    return {
        "requests": paths.requests,
        "quarantine": paths.quarantine,
        "summary": paths.summary,
        "manifest": paths.manifest,
        **{f"part_{i}": p for i, p in enumerate(linked)},
    }
