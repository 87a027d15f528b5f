"""The ingest stage: inputs → run → write, called alike by the ``workload`` asset and
``enginefit ingest``; and how later stages read the canonical table back.

Inputs are the configured trace files (or, for the ad-hoc command, the paths given) with the
workload's read settings (block size, salt, anchor, tokenizer). Outputs (paths:
:class:`pipeline.layout.IngestPaths`): the request parts, the quarantine and the summary,
published as one set with a manifest (:func:`pipeline.store.publish_ingest`) and checked
against it whenever they are read back.

:func:`read_inputs` → :func:`run` → :func:`write`, out of core: :func:`plan` →
:func:`read_one` → :func:`stage_read` per file, then :func:`merge_publish` (the same bytes as
:func:`merge` then :func:`write`, one request part in memory at a time). The ``workload`` asset
fans these out, one step per file; ``enginefit ingest`` calls them in turn
(:func:`run_publish`). :func:`read_inputs` takes no layout: ingest's inputs are the trace files the
``workload`` section names, not an earlier stage's outputs; :func:`adhoc_inputs` is the
command's alternative for files named on the command line. Later stages read the canonical
table back with :func:`pipeline.store.read_requests`, and the summary with
:func:`read_summary`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl

from pipeline import results
from pipeline.errors import InputFormatError
from pipeline.ingest.compute import (
    SourceRead,
    TraceFormat,
    distinct_sources,
    expand_paths,
    ingest_sources,
    merge_reads,
    read_source,
    read_source_chunks,
)
from pipeline.ingest.config import (
    SALT_ENV_VAR,
    IngestConfig,
    ReadConfig,
    TraceSource,
    documented_anchor,
)
from pipeline.ingest.outofcore import merge_staged
from pipeline.ingest.readers import ReadContext, SourceFile
from pipeline.ingest.readers.base import ReadResult
from pipeline.ingest.readers.columns import ColumnsReader
from pipeline.ingest.result import IngestResult, IngestSummary, SkippedFile
from pipeline.ingest.tokenize import make_tokenizer
from pipeline.layout import WorkloadLayout
from pipeline.safe_read import read_json
from pipeline.schema import empty_canonical
from pipeline.settings import with_flags
from pipeline.store import (
    STAGED_READS_PREFIX,
    OutputError,
    claim_workload,
    open_stage_output,
    publish_ingest,
    remove_staged_reads,
    verify_ingest,
    write_parquet_atomic,
)

STEP = results.Step(results.REQUESTS, sections=("workload",))

ROWS_PER_PART = 1_000_000
# Records of a trace file read (and staged) at a time: what bounds a large file's memory.
CHUNK_RECORDS = 1_000_000
# Ad-hoc analyses never persist hashes, so without a configured salt any fixed one will do.
ADHOC_SALT = b"enginefit-adhoc"


@dataclass(frozen=True)
class IngestInputs:
    sources: tuple[SourceFile, ...]
    formats: tuple[TraceFormat, ...]
    context: ReadContext
    anchor_is_default: bool = False

    def total_bytes(self) -> int:
        """Bytes to read, for progress only: a file that cannot be sized counts 0 and is left
        to its reader, which says what is wrong with it."""
        return sum(_size_or_zero(source) for source in self.sources)


def _size_or_zero(source: SourceFile) -> int:
    try:
        return source.size()
    except OSError:
        return 0


def read_inputs(
    workload: IngestConfig,
    base: Path,
    progress: Callable[[int], None] | None = None,
    *,
    traces: Sequence[TraceSource] | None = None,
) -> IngestInputs:
    """The ``workload`` section's trace files (or ``traces`` instead: one day's, possibly none,
    :mod:`pipeline.ingest.days`), read with its settings; ``base`` is the configuration's
    folder, which lineage names the files relative to."""
    sources: list[SourceFile] = []
    formats: list[TraceFormat] = []
    for trace in workload.traces if traces is None else traces:
        for source in expand_paths([trace.path]):
            # Lineage names files as the configuration does (relative to it), so outputs do
            # not depend on where the project is checked out.
            label = trace.display if str(source.path) == trace.path else _relative(source, base)
            sources.append(SourceFile.of(source.path, label))
            formats.append(ColumnsReader(trace.columns) if trace.columns else trace.format)
    return IngestInputs(
        tuple(sources),
        tuple(formats),
        ReadContext(
            block_size=workload.block_size,
            salt=workload.salt_bytes,
            anchor=workload.anchor,
            tokenizer=make_tokenizer(str(workload.tokenizer) if workload.tokenizer else None),
            progress=progress,
        ),
        anchor_is_default=_is_default_anchor(workload.anchor),
    )


def _is_default_anchor(anchor: datetime) -> bool:
    """The anchor is the documented default (pipeline/defaults.yaml), not one the user chose."""
    return anchor == documented_anchor()


def _relative(source: SourceFile, base: Path) -> str:
    try:
        return str(source.path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(source.path)


def adhoc_inputs(
    paths: Sequence[str | Path],
    read: ReadConfig,
    configured_salt: str | None = None,
    *,
    fmt: str = "auto",
    block_size: int | None = None,
    anchor: datetime | None = None,
    tokenizer: str | None = None,
    persist: bool = False,
    progress: Callable[[int], None] | None = None,
) -> IngestInputs:
    """Trace files named on the command line, read with the configuration's read settings
    (``configured_salt``: the workload's, if one is configured) and the flags that override
    them. ``persist`` (ingest) hashes with the real salt, or with none (an error once a trace
    needs one); an analysis that only prints results may use a fixed ad-hoc one."""
    if block_size is not None:
        block_size = with_flags(read, {"block_size": ("--block-size", block_size)}).block_size
    salt = os.environ.get(SALT_ENV_VAR) or configured_salt or ""
    configured_tokenizer = str(read.tokenizer) if read.tokenizer else None
    sources = expand_paths(paths)
    read_anchor = anchor or read.anchor
    return IngestInputs(
        tuple(sources),
        tuple(fmt for _ in sources),
        ReadContext(
            block_size=block_size or read.block_size,
            salt=salt.encode() if salt or persist else ADHOC_SALT,
            anchor=read_anchor,
            tokenizer=make_tokenizer(tokenizer or configured_tokenizer),
            progress=progress,
        ),
        anchor_is_default=anchor is None and _is_default_anchor(read_anchor),
    )


def run(inputs: IngestInputs) -> IngestResult:
    return ingest_sources(
        list(inputs.sources),
        inputs.context,
        formats=list(inputs.formats),
        anchor_is_default=inputs.anchor_is_default,
    )


@dataclass(frozen=True)
class PlannedSource:
    """One distinct source to read: its index in ``IngestInputs.sources``, digest and position
    among those read (what the ``workload`` asset fans out, one step each)."""

    index: int
    digest: str
    position: int
    label: str


def plan(inputs: IngestInputs) -> tuple[list[PlannedSource], list[SkippedFile]]:
    """The distinct sources to read, one step each; a file given twice is read once."""
    if not inputs.sources:
        raise InputFormatError("no trace files given")
    kept, skipped = distinct_sources(inputs.sources)
    planned = [
        PlannedSource(index, digest, position, inputs.sources[index].label)
        for position, (index, digest) in enumerate(kept)
    ]
    return planned, skipped


def read_one(inputs: IngestInputs, planned: PlannedSource) -> SourceRead:
    return read_source(
        inputs.sources[planned.index],
        inputs.formats[planned.index],
        inputs.context,
        digest=planned.digest,
        position=planned.position,
    )


@dataclass(frozen=True)
class StagedRead:
    """A source read whose rows wait in a Parquet file of the workload folder: what a per-file
    step hands on, so that a file's rows cross from step to step as one file written once, not
    as an object the run's IO manager pickles and unpickles (at 10M requests, gigabytes held
    twice in memory and written twice to the run storage)."""

    read: SourceRead  # its result's requests emptied (their count kept in ``rows``)
    rows: Path  # the rows (of a file read in chunks, the first chunk's)
    more: tuple[Path, ...] = ()  # the later chunks' rows, in file order

    @property
    def files(self) -> tuple[Path, ...]:
        return (self.rows, *self.more)

    @property
    def folder(self) -> Path:
        return self.rows.parent


def stage_read(read: SourceRead, layout: WorkloadLayout) -> StagedRead:
    """Write ``read``'s rows to ``layout``'s staging folder for this file. The merge reads it
    back before it publishes the set, and publishing clears the workload's staging folders
    (:func:`pipeline.store.claim_workload`), so this one goes then, or with a killed run's
    leftovers at the next ingest."""
    stager = _Stager(read.digest, read.position, layout)
    with stager:
        stager.write(read.result.requests)
    return stager.staged(read)


def read_stage(
    inputs: IngestInputs,
    planned: PlannedSource,
    layout: WorkloadLayout,
    *,
    records: int | None = None,
) -> StagedRead:
    """:func:`read_one` then :func:`stage_read`, with memory bounded by ``records``, not by the
    file: a format read line by line (:meth:`~pipeline.ingest.readers.base.Reader.read_chunks`)
    hands on its rows every ``records`` records (default :data:`CHUNK_RECORDS`), each chunk
    staged as a file of its own."""
    stager = _Stager(planned.digest, planned.position, layout)
    with stager:
        read = read_source_chunks(
            inputs.sources[planned.index],
            inputs.formats[planned.index],
            inputs.context,
            stager.write,
            digest=planned.digest,
            position=planned.position,
            records=records or CHUNK_RECORDS,
        )
        if not stager.rows:  # no rows at all: one empty file gives the merge their columns
            stager.write(empty_canonical())
    return stager.staged(read)


class _Stager:
    """The staged rows of one source, written chunk by chunk into its staging folder; all of
    them removed if the read or a write fails."""

    def __init__(self, digest: str, position: int, layout: WorkloadLayout) -> None:
        self.layout = layout
        self.target = layout.root / f"{STAGED_READS_PREFIX}{digest[:16] or f'{position:016x}'}"
        self.rows: list[Path] = []

    def __enter__(self) -> _Stager:
        open_stage_output(self.layout)
        self.target.mkdir(exist_ok=True)
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is not None:
            remove_staged_reads(self.target)

    def write(self, rows: pl.DataFrame) -> None:
        if self.rows and not rows.height:
            return
        # Named as request parts are, so the cleanup of staging folders knows them as its own.
        path = self.target / f"part-{len(self.rows):05d}.parquet"
        # An error names the request table's first part, what is being written, not the
        # staging folder's hidden name.
        write_parquet_atomic(rows, path, shown=self.layout.ingest.part(0))
        self.rows.append(path)

    def staged(self, read: SourceRead) -> StagedRead:
        result = read.result
        emptied = ReadResult(
            result.requests.clear(),
            result.quarantine,
            records_read=result.quarantine.height,  # the rows' own count is in the files
            prompt_blocks_capped=result.prompt_blocks_capped,
            notes=result.notes,
        )
        first, *more = self.rows
        return StagedRead(replace(read, result=emptied), first, tuple(more))


def _require_rows(staged: StagedRead) -> None:
    gone = next((path for path in staged.files if not path.is_file()), None)
    if gone is not None:
        raise OutputError(
            f"{gone}: the rows read from {staged.read.source.label} are gone (another "
            "ingest of this workload ran in between and cleared them); run the ingest again"
        )


def unstage(staged: StagedRead) -> SourceRead:
    """The source read back whole from its staged rows."""
    _require_rows(staged)
    requests = pl.concat([pl.read_parquet(path) for path in staged.files])
    result = staged.read.result
    return replace(
        staged.read,
        result=ReadResult(
            requests,
            result.quarantine,
            records_read=requests.height + result.quarantine.height,
            prompt_blocks_capped=result.prompt_blocks_capped,
            notes=result.notes,
        ),
    )


def merge(
    inputs: IngestInputs,
    reads: Sequence[SourceRead | StagedRead],
    skipped: Sequence[SkippedFile],
) -> IngestResult:
    """What :func:`run` returns, from the sources read one by one (in any order)."""
    whole = [unstage(r) if isinstance(r, StagedRead) else r for r in reads]
    return merge_reads(
        whole, inputs.context, skipped=skipped, anchor_is_default=inputs.anchor_is_default
    )


@dataclass(frozen=True)
class Merged:
    """A merged set as published: its summary, the paths :func:`publish` names, and the first
    rows of the request table (what the UI shows)."""

    summary: IngestSummary
    paths: dict[str, Path]
    preview: pl.DataFrame


PREVIEW_ROWS = 5


def merge_publish(
    inputs: IngestInputs,
    reads: Sequence[StagedRead],
    skipped: Sequence[SkippedFile],
    layout: WorkloadLayout,
) -> Merged:
    """:func:`merge` then :func:`write`, byte for byte, out of core: the staged rows are read
    back a few columns at a time and the request parts made one by one
    (:mod:`pipeline.ingest.outofcore`), so memory holds one part, not the workload."""
    folders = {staged.folder for staged in reads}
    with claim_workload(layout, keep=folders):  # the staged rows are read while it is held
        for staged in reads:
            _require_rows(staged)
        streamed = (
            merge_staged(
                [(staged.read, staged.files) for staged in reads],
                inputs.context,
                skipped=skipped,
                anchor_is_default=inputs.anchor_is_default,
                rows_per_part=ROWS_PER_PART,
            )
            if reads
            else None
        )
        if streamed is None:  # nothing to read, or arrivals the eager merge must place
            result = merge(inputs, reads, skipped)
            merged = Merged(
                result.summary, write(result, layout), result.requests.head(PREVIEW_ROWS)
            )
        else:
            heads: list[pl.DataFrame] = []

            def parts() -> Iterator[pl.DataFrame]:
                for part in streamed.parts():
                    if not heads:  # copied: a slice would hold the part's buffers to the end
                        head = part.head(PREVIEW_ROWS).to_dicts()
                        heads.append(pl.from_dicts(head, schema=part.schema))
                    yield part

            paths = publish(layout, parts(), streamed.quarantine, streamed.summary)
            merged = Merged(streamed.summary, paths, heads[0])
        for folder in folders:
            remove_staged_reads(folder)
    return merged


def run_publish(inputs: IngestInputs, layout: WorkloadLayout) -> Merged:
    """:func:`run` then :func:`write`, as the ``workload`` asset's steps do it, in one process:
    each source read and staged in turn (:func:`read_one`, :func:`stage_read`: one file's rows
    in memory at a time), then :func:`merge_publish`. What ``enginefit ingest`` calls, so the
    command and the asset publish the same bytes by the same code."""
    with claim_workload(layout):
        planned, skipped = plan(inputs)
        staged: list[StagedRead] = []
        try:
            for source in planned:
                staged.append(read_stage(inputs, source, layout))
            return merge_publish(inputs, staged, skipped, layout)
        except BaseException:
            for folder in {s.folder for s in staged}:
                remove_staged_reads(folder)
            raise


def split_parts(requests: pl.DataFrame) -> list[pl.DataFrame]:
    """``requests`` in parts of at most ROWS_PER_PART rows (one part, maybe empty, at least)."""
    n_parts = max(1, -(-requests.height // ROWS_PER_PART))
    # One chunk, so every part is a slice of the whole table's columns as the out-of-core merge
    # lays them out: the Parquet writer sizes a list column's pages by the array a slice is of.
    whole = requests.rechunk()
    return [whole.slice(i * ROWS_PER_PART, ROWS_PER_PART) for i in range(n_parts)]


def write(result: IngestResult, layout: WorkloadLayout) -> dict[str, Path]:
    """Publish the request parts, the quarantine and the summary as one set."""
    return publish(layout, split_parts(result.requests), result.quarantine, result.summary)


def publish(
    layout: WorkloadLayout,
    parts: Iterable[pl.DataFrame | Path],
    quarantine: pl.DataFrame,
    summary: IngestSummary,
    extra: dict[str, Any] | None = None,
) -> dict[str, Path]:
    """Publish an ingest set (parts written, or linked when given as paths) and name its files."""
    paths = layout.ingest
    published = publish_ingest(layout, parts, quarantine, summary.to_json(), extra=extra)
    return {
        "requests": paths.requests,
        "quarantine": paths.quarantine,
        "summary": paths.summary,
        "manifest": paths.manifest,
        **{f"part_{i}": p for i, p in enumerate(published)},
    }


def read_summary(layout: WorkloadLayout) -> IngestSummary:
    """The ingest summary, checked against the set's manifest (its request parts are checked
    by whoever reads them, :func:`~pipeline.store.read_requests`)."""
    verify_ingest(layout, summary_only=True)
    return IngestSummary.from_json(read_json(results.INGEST_SUMMARY.require(layout)))
