"""Ingest one UTC day at a time, and the workload as the union of its days.

A quarter of traces is usually exported a file (or a few) per day. With
``workload.daily_quarter`` set (Dagster daily partitions, ``assets/days.py``) each day is
ingested on its own, from the configured trace paths with ``{day}`` replaced by the day
(``traces/requests-{day}.jsonl`` → ``traces/requests-2025-01-05.jsonl``), into
``<workload>/days/<day>/``: a complete ingest set (parts, quarantine, summary, manifest;
:mod:`pipeline.store`). A record that does not arrive on its partition's day is quarantined
(``outside_partition``), so the days never overlap and, taken in order, stay sorted by arrival.
A day no file covers is an empty day (no request, a note saying why), not a failure.

The workload itself is then the union: its ``requests/`` holds hard links to every day's parts
(no copy; each later stage scans them lazily as before), its quarantine and summary are the
days' together, and its manifest is written last, as for a single ingest. A request id that an
earlier day has already is quarantined there (``duplicate_request_id``; the earliest day's
record wins, as the first file wins in one ingest of every file), and only such a day's parts
are written anew instead of linked. A day depends on its own files only, so re-ingesting a day
replaces that day's set alone; the union is published again from the days as they are.

Publishing the union again after one day changed reads and writes what that day changes, not
the other days' parts: the request ids are compared across days as hashes (two 64-bit hashes
of each id, kept per day in ``days/.request-ids/`` and written with the day's set), and a day
an earlier day repeats ids of is kept as the union holds it (``days/.union/<day>/``, an ingest
set of its own) until that day or the ids it repeats change. The rest is the days' small files
(manifests, summaries, quarantines) and links to their parts.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import glob
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from pipeline.digests import sha256_file
from pipeline.errors import ConfigError, InputFormatError
from pipeline.ingest import stage
from pipeline.ingest.compute import (
    DUPLICATE_DETAIL,
    DUPLICATE_ID,
    arrival_span,
    as_quarantine,
    by_reason,
    out_of_order,
)
from pipeline.ingest.config import DAY_FIELD, IngestConfig, TraceSource
from pipeline.ingest.result import FileSummary, IngestResult, IngestSummary
from pipeline.layout import WorkloadLayout
from pipeline.safe_read import read_json
from pipeline.schema import empty_quarantine
from pipeline.settings import QUARTER
from pipeline.store import (
    claim_workload,
    open_stage_output,
    read_requests,
    remove_ingest_set,
    verify_ingest,
    write_parquet_atomic,
)

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
    match = QUARTER.match(quarter)
    if match is None:
        raise ConfigError(f"{quarter!r}: not a quarter (YYYY-Qn, e.g. 2025-Q1)")
    year, first_month = int(match.group(1)), 3 * (int(match.group(2)) - 1) + 1
    start = dt.date(year, first_month, 1)
    end = dt.date(year + first_month // 10, (first_month + 2) % 12 + 1, 1)
    return start, end


def _exists(path: str) -> bool:
    return bool(glob.glob(path)) if glob.has_magic(path) else Path(path).exists()


def day_traces(
    workload: IngestConfig, day: str, *, where: str
) -> tuple[list[TraceSource], list[TraceSource]]:
    """The configured trace paths with ``{day}`` set to ``day``: those that name a file (or
    match one), and those that do not (that source has nothing for the day). ``where`` names
    the configuration file in errors."""
    quarter = workload.daily_quarter
    if quarter is None:
        raise ConfigError(
            f"{where}: workload.daily_quarter is not set: set it to the quarter to ingest "
            "day by day (YYYY-Qn), with {day} in every trace path"
        )
    start, end = quarter_bounds(quarter)
    if not start <= parse_day(day) < end:
        raise ConfigError(f"{where}: {day} is not a day of workload.daily_quarter {quarter}")
    found: list[TraceSource] = []
    missing: list[TraceSource] = []
    for trace in workload.traces:
        path, label = trace.path.replace(DAY_FIELD, day), trace.label.replace(DAY_FIELD, day)
        (found if _exists(path) else missing).append(trace.replace(path=path, label=label))
    return found, missing


def move_to_quarantine(
    result: IngestResult, moved: pl.Series, *, field: str, reason: str, detail: pl.Expr, note: str
) -> IngestResult:
    """``result`` with the requests ``moved`` selects quarantined as ``reason``: every count
    (per file and in total) reconciled again, the arrival figures those of the requests left."""
    rows = result.requests.filter(moved)
    if not rows.height:
        return result
    kept = result.requests.filter(~moved)
    quarantine = pl.concat([result.quarantine, as_quarantine(rows, field, reason, detail)]).sort(
        ["source_file", "source_line"]
    )
    per_file = dict(rows.group_by("source_file").len().iter_rows())
    files = []
    for f in result.summary.files:
        n = per_file.get(f.file, 0)
        reasons = dict(f.quarantined_by_reason)
        if n:
            reasons[reason] = reasons.get(reason, 0) + n
        files.append(
            dataclasses.replace(
                f,
                ingested=f.ingested - n,
                quarantined=f.quarantined + n,
                quarantined_by_reason=dict(sorted(reasons.items())),
            )
        )
    first, last, span_s = arrival_span(kept)
    # Out of order counts each file's records in the order the file holds them.
    lines = kept.select("source_file", "source_line", "arrival").sort("source_file", "source_line")
    summary = dataclasses.replace(
        result.summary,
        files=files,
        ingested=kept.height,
        quarantined=quarantine.height,
        quarantined_by_reason=by_reason(quarantine),
        out_of_order=out_of_order(lines, "source_file"),
        duplicate_timestamps=kept.height - kept["arrival"].n_unique(),
        duplicate_request_ids=result.summary.duplicate_request_ids
        + (rows.height if reason == DUPLICATE_ID else 0),
        first_arrival=first,
        last_arrival=last,
        span_s=span_s,
        notes=[*result.summary.notes, note],
    )
    return IngestResult(kept, quarantine, summary)


def restrict_to_day(result: IngestResult, day: str) -> IngestResult:
    """Keep the requests arriving on ``day`` (UTC); quarantine the others as
    ``outside_partition``, with every count reconciled again."""
    start, end = day_window(day)
    arrival = result.requests["arrival"]
    outside = (arrival < start) | (arrival >= end)
    n = int(outside.sum())
    return move_to_quarantine(
        result,
        outside,
        field="arrival",
        reason=OUTSIDE,
        detail=pl.format("arrives {}, outside the partition's day " + day, pl.col("arrival")),
        note=f"{n:,} record(s) arrive outside {day} (UTC) and were quarantined as {OUTSIDE}: "
        "each belongs to the partition of its own day",
    )


def run_day(workload: IngestConfig, base: Path, day: str, *, where: str) -> IngestResult:
    """The records of ``day``'s trace files that arrive on ``day``; the rest quarantined. A
    source with no file for the day adds nothing; with none at all the day is empty. ``base``
    and ``where``: :func:`pipeline.ingest.stage.read_inputs`'s and :func:`day_traces`'."""
    found, missing = day_traces(workload, day, where=where)
    inputs = stage.read_inputs(workload, base, traces=found)
    result = stage.run(inputs) if found else stage.merge(inputs, [], [])
    if missing:
        labels = ", ".join(t.display for t in missing)
        empty = "" if found else ": an empty day (no request)"
        notes = [*result.summary.notes, f"no trace file for {day} at {labels}{empty}"]
        result.summary = dataclasses.replace(result.summary, notes=notes)
    return restrict_to_day(result, day)


def write_day(result: IngestResult, layout: WorkloadLayout, day: str) -> dict[str, Path]:
    """Publish one day's set under ``days/<day>/`` (the workload folder marked as enginefit's
    first, so the days may be written side by side). Only that day's folder changes, held by
    this writer (on object storage, by this machine: another writer of the day waits)."""
    open_stage_output(layout)
    with claim_workload(layout.day(day)):
        paths = stage.write(result, layout.day(day))
        _write_id_hashes(layout, day, id_hashes(result.requests.lazy()).collect())
    return paths


# The hashes of a request id, two 64-bit ones from different seeds: ids whose pairs are equal
# are taken as equal (a false match is about 1 in 2^128 a pair of ids). Polars' hash may change
# between its versions, so stored hashes name the version that made them.
_ID_HASHES = ("h0", "h1")
_ID_HASH_VERSION = f"polars-{pl.__version__}"


def id_hashes(requests: pl.LazyFrame) -> pl.LazyFrame:
    """The request ids of ``requests`` as their two hashes (columns h0, h1), in row order."""
    return requests.select(
        pl.col("request_id").hash(seed=seed).alias(name) for seed, name in enumerate(_ID_HASHES)
    )


def _id_hashes_path(layout: WorkloadLayout, day: str) -> Path:
    """Where ``day``'s id hashes are for the set published now (named by its manifest)."""
    version = f"{sha256_file(layout.day(day).ingest.manifest)[:16]}.{_ID_HASH_VERSION}"
    return layout.day_request_ids(day, version)


def _write_id_hashes(layout: WorkloadLayout, day: str, hashes: pl.DataFrame) -> Path:
    path = _id_hashes_path(layout, day)
    path.parent.mkdir(exist_ok=True)
    write_parquet_atomic(hashes, path)
    for older in path.parent.glob(f"{day}.*.parquet"):
        if older != path:
            older.unlink(missing_ok=True)
    return path


def day_id_hashes(layout: WorkloadLayout, day: str, ingested: int) -> Path:
    """The file of ``day``'s id hashes (``ingested`` rows): as written with the day's set, or
    made from its parts (the id column only) when that set was written otherwise."""
    path = _id_hashes_path(layout, day)
    if path.is_file() and pl.scan_parquet(path).select(pl.len()).collect().item() == ingested:
        return path
    hashes = id_hashes(read_requests(layout.day(day))).collect()
    return _write_id_hashes(layout, day, hashes)


def union_day_sets(layout: WorkloadLayout) -> dict[str, str] | None:
    """The days the workload's table unites, each with the digest of the set it holds of it
    (its requests as the union has them: a later stage may keep what it computed from a day
    under it); None for a workload not published from days."""
    (held,) = _union_entries(layout, "day_sets")
    return held


def _union_entries(layout: WorkloadLayout, *keys: str) -> list[dict[str, Any] | None]:
    """The union manifest's mappings ``keys`` (each None where it has none: a workload not
    published from days, or by a version that did not record it)."""
    manifest = read_json(layout.ingest.manifest)
    found = [manifest.get(key) if isinstance(manifest, dict) else None for key in keys]
    return [dict(value) if isinstance(value, dict) else None for value in found]


@dataclass(frozen=True)
class UnitedDay:
    """A day of the union: the digest of the set the union holds of it and how many of the
    union's parts (in order, after the earlier days') are that set's."""

    day: str
    digest: str
    parts: int


def united_days(layout: WorkloadLayout) -> list[UnitedDay] | None:
    """The union's days in order, each with its set's digest and parts; None for a workload
    not published from days, or by a version that did not record its days' parts."""
    held, counts = _union_entries(layout, "day_sets", "day_parts")
    if held is None or counts is None or held.keys() != counts.keys():
        return None
    return [UnitedDay(day, str(held[day]), int(counts[day])) for day in sorted(held)]


def held_day_set(layout: WorkloadLayout, day: str) -> WorkloadLayout:
    """The set the workload's union holds of ``day``: the day's own, unless the union recorded
    a digest for it other than its own manifest's (its copy without the requests an earlier day
    has, :meth:`~pipeline.layout.WorkloadLayout.day_in_union`, which stays on the machine that
    wrote the union)."""
    held, lineage = _union_entries(layout, "day_sets", "days")
    if held is not None and lineage is not None and held.get(day) != lineage.get(day):
        return layout.day_in_union(day)
    return layout.day(day)


def ingested_days(layout: WorkloadLayout, days: Sequence[str] | None = None) -> list[str]:
    """The days with an ingest set on disk (of ``days`` when given), in order."""
    if not layout.days_dir.is_dir():
        return []
    present = sorted(
        p.name for p in layout.days_dir.iterdir() if _DAY_NAME.match(p.name) and p.is_dir()
    )
    return present if days is None else [d for d in present if d in set(days)]


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
    reasons: dict[str, int] = {}
    for s in summaries:
        for reason, n in s.quarantined_by_reason.items():
            reasons[reason] = reasons.get(reason, 0) + n
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
        quarantined_by_reason=dict(sorted(reasons.items())),
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


def repeated_ids(hashes: Sequence[Path]) -> dict[int, pl.DataFrame]:
    """Per day (its index in ``hashes``, the days' id hash files in day order): the id hashes
    an earlier day has already. Memory: one 64-bit hash a request, then the few rows whose
    first hash repeats."""
    first = np.concatenate(
        [pl.read_parquet(path, columns=["h0"])["h0"].to_numpy() for path in hashes]
    )
    first.sort()
    repeated = np.unique(first[1:][first[1:] == first[:-1]])
    del first
    if not repeated.size:
        return {}
    candidates = pl.Series(repeated, dtype=pl.UInt64).implode()
    rows = pl.concat(
        pl.scan_parquet(path)
        .filter(pl.col("h0").is_in(candidates))
        .with_columns(pl.lit(i, pl.Int32).alias("day"))
        for i, path in enumerate(hashes)
    ).collect()
    earliest = rows.group_by(_ID_HASHES).agg(pl.col("day").min().alias("first"))
    later = rows.join(earliest, on=_ID_HASHES).filter(pl.col("day") > pl.col("first"))
    return {
        int(day[0]): frame.select(_ID_HASHES).sort(_ID_HASHES)
        for day, frame in later.group_by("day")
    }


def _repeats_moved(
    layout: WorkloadLayout, day: str, lineage: str, repeated: pl.DataFrame
) -> WorkloadLayout:
    """``day``'s set with the requests whose id hashes ``repeated`` lists quarantined, as the
    union holds it: published under ``days/.union/<day>/`` and kept there while the day and
    what it repeats stay the same."""
    held = layout.day_in_union(day)
    digest = hashlib.sha256(repeated.to_numpy().astype("<u8").tobytes()).hexdigest()
    key = {"day_manifest": lineage, "hashes": _ID_HASH_VERSION, "repeated_sha256": digest}
    if held.ingest.manifest.is_file():
        try:
            verify_ingest(held)
            if read_json(held.ingest.manifest).get("union_of") == key:
                return held
        except InputFormatError:
            pass  # an interrupted copy: made again below
    day_layout = layout.day(day)
    requests = read_requests(day_layout).collect()
    path = day_layout.ingest.quarantine
    quarantine = pl.read_parquet(path) if path.exists() else empty_quarantine()
    moved = (
        id_hashes(requests.lazy())
        .with_row_index("row")
        .join(repeated.lazy(), on=_ID_HASHES, how="semi")
        .select("row")
        .collect()
    )
    mask = np.zeros(requests.height, bool)
    mask[moved["row"].to_numpy()] = True
    result = move_to_quarantine(
        IngestResult(requests, quarantine, stage.read_summary(day_layout)),
        pl.Series(mask),
        field="request_id",
        reason=DUPLICATE_ID,
        detail=pl.lit(DUPLICATE_DETAIL),
        note=f"{moved.height:,} record(s) repeat the request id of an earlier day and were "
        f"quarantined as {DUPLICATE_ID} (the earliest day's record is kept)",
    )
    stage.publish(
        held,
        stage.split_parts(result.requests),
        result.quarantine,
        result.summary,
        extra={"union_of": key},
    )
    return held


@dataclass(frozen=True)
class Union:
    """What publishing the union wrote, and what it found across the days."""

    paths: dict[str, Path]
    repeated_across_days: int  # requests quarantined: an earlier day has their id
    empty_days: list[str]  # days ingested with no request


def write_union(layout: WorkloadLayout, days: Sequence[str]) -> Union:
    """Publish the workload's ingest set as the union of ``days`` (each checked against its
    manifest first): their parts linked in day order, a request whose id an earlier day has
    quarantined (``duplicate_request_id``), their quarantines and summaries joined, and the
    days' manifest digests recorded in the workload's manifest. The workload folder is held
    throughout (on object storage, by this machine: another union's writer waits)."""
    if not days:
        raise ConfigError(
            f"{layout.days_dir}: no day ingested yet; materialise partitions of workload_day first"
        )
    with claim_workload(layout):
        return _write_union(layout, days)


def _write_union(layout: WorkloadLayout, days: Sequence[str]) -> Union:
    layouts = [layout.day(day) for day in days]
    for day_layout in layouts:  # each set whole before any of it is linked
        verify_ingest(day_layout)
    summaries = [stage.read_summary(day_layout) for day_layout in layouts]
    lineage = {day: sha256_file(d.ingest.manifest) for day, d in zip(days, layouts, strict=True)}
    hashes = [
        day_id_hashes(layout, day, summary.ingested)
        for day, summary in zip(days, summaries, strict=True)
    ]
    repeated = repeated_ids(hashes)
    united, quarantines = [], []
    held_sets: dict[str, str] = {}
    day_parts: dict[str, int] = {}
    parts: list[pl.DataFrame | Path] = []
    for index, (day, day_layout) in enumerate(zip(days, layouts, strict=True)):
        held = day_layout
        if index in repeated:
            held = _repeats_moved(layout, day, lineage[day], repeated[index])
        elif layout.day_in_union(day).root.is_dir():
            remove_ingest_set(layout.day_in_union(day))  # its repeats are gone
        path = held.ingest.quarantine
        quarantines.append(pl.read_parquet(path) if path.exists() else empty_quarantine())
        united.append((day, summaries[index] if held is day_layout else stage.read_summary(held)))
        held_sets[day] = sha256_file(held.ingest.manifest)
        day_parts[day] = len(held.ingest.parts())
        parts += held.ingest.parts()
    joined = pl.concat(quarantines).sort(["source_file", "source_line"])
    extra = {"days": lineage, "day_sets": held_sets, "day_parts": day_parts}
    paths = stage.publish(layout, parts, joined, union_summary(united), extra=extra)
    return Union(
        paths,
        sum(ids.height for ids in repeated.values()),
        [day for day, summary in united if not summary.ingested],
    )
