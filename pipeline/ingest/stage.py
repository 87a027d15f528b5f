"""The ingest stage: inputs → run → write, called alike by the ``workload`` asset and
``enginefit ingest``; and how later stages read the canonical table back.

Inputs are the configured trace files (or, for the ad-hoc command, the paths given) with the
workload's read settings (block size, salt, anchor, tokenizer). Outputs (paths:
:class:`pipeline.layout.IngestPaths`): the request parts, the quarantine and the summary.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import polars as pl

from pipeline.config import SALT_ENV_VAR, Config
from pipeline.errors import ConfigError
from pipeline.ingest.compute import expand_paths, ingest_sources
from pipeline.ingest.result import IngestResult, IngestSummary
from pipeline.layout import WorkloadLayout, require_output
from pipeline.readers import ReadContext, SourceFile
from pipeline.settings import with_flags
from pipeline.store import scan_requests, write_json_atomic, write_parquet_atomic
from pipeline.tokenize import make_tokenizer

ROWS_PER_PART = 1_000_000
# Ad-hoc analyses never persist hashes, so without a configured salt any fixed one will do.
ADHOC_SALT = b"enginefit-adhoc"


@dataclass(frozen=True)
class IngestInputs:
    sources: tuple[SourceFile, ...]
    formats: tuple[str, ...]
    context: ReadContext

    def total_bytes(self) -> int:
        return sum(source.size() for source in self.sources)


def configured_inputs(
    config: Config, progress: Callable[[int], None] | None = None
) -> IngestInputs:
    """The configured workload's trace files, read with its settings."""
    workload = config.require_workload()
    base = config.source.parent if config.source else Path.cwd()
    sources, formats = [], []
    for trace in workload.traces:
        for source in expand_paths([trace.path]):
            # Lineage names files as the configuration does (relative to it), so outputs do
            # not depend on where the project is checked out.
            label = trace.display if str(source.path) == trace.path else _relative(source, base)
            sources.append(SourceFile.of(source.path, label))
            formats.append(trace.format)
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
    )


def _relative(source: SourceFile, base: Path) -> str:
    try:
        return str(source.path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(source.path)


def adhoc_inputs(
    paths: Sequence[str | Path],
    config: Config,
    *,
    fmt: str = "auto",
    block_size: int | None = None,
    anchor: datetime | None = None,
    tokenizer: str | None = None,
    persist: bool = False,
    progress: Callable[[int], None] | None = None,
) -> IngestInputs:
    """Trace files named on the command line, read with the configuration's settings and the
    flags that override them. ``persist`` (ingest) needs a real salt; an analysis that only
    prints results may use a fixed ad-hoc one."""
    if block_size is not None:
        block_size = with_flags(
            config.read, {"block_size": ("--block-size", block_size)}
        ).block_size
    workload = config.workload
    salt = os.environ.get(SALT_ENV_VAR) or (workload.hash_salt if workload else "")
    if persist and not salt:
        raise ConfigError(
            f"no hash salt: pass --config FILE with workload.hash_salt or set {SALT_ENV_VAR}"
        )
    configured_tokenizer = str(config.read.tokenizer) if config.read.tokenizer else None
    sources = expand_paths(paths)
    return IngestInputs(
        tuple(sources),
        tuple(fmt for _ in sources),
        ReadContext(
            block_size=block_size or config.read.block_size,
            salt=salt.encode() if salt else ADHOC_SALT,
            anchor=anchor or config.read.anchor,
            tokenizer=make_tokenizer(tokenizer or configured_tokenizer),
            progress=progress,
        ),
    )


def run(inputs: IngestInputs) -> IngestResult:
    return ingest_sources(list(inputs.sources), inputs.context, formats=list(inputs.formats))


def write_requests(requests: pl.DataFrame, layout: WorkloadLayout) -> list[Path]:
    """Replace the workload's request parts with ``requests``, atomically as a whole."""
    paths = layout.ingest
    final = paths.requests
    paths.ensure()
    staging = Path(tempfile.mkdtemp(prefix=".requests.", dir=paths.dir))
    try:
        n_parts = max(1, -(-requests.height // ROWS_PER_PART))
        staged = WorkloadLayout(staging.parent).ingest
        for part in range(n_parts):
            chunk = requests.slice(part * ROWS_PER_PART, ROWS_PER_PART)
            name = staged.part(part).name
            chunk.write_parquet(staging / name, compression="zstd")
        old = paths.dir / f".requests.old.{os.getpid()}"
        if final.exists():
            final.rename(old)
        staging.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return paths.parts()


def write(result: IngestResult, layout: WorkloadLayout) -> dict[str, Path]:
    """Write the request parts, the quarantine and the summary; each write is atomic."""
    paths = layout.ingest
    parts = write_requests(result.requests, layout)
    write_parquet_atomic(result.quarantine, paths.quarantine)
    write_json_atomic(paths.summary, result.summary.to_json())
    return {
        "requests": paths.requests,
        "quarantine": paths.quarantine,
        "summary": paths.summary,
        **{f"part_{i}": p for i, p in enumerate(parts)},
    }


def read_requests(layout: WorkloadLayout) -> pl.LazyFrame:
    """The canonical request table of a workload, scanned lazily."""
    return scan_requests(
        require_output(layout.ingest.requests, "canonical request table", "ingest", "workload")
    )


def read_summary(layout: WorkloadLayout) -> IngestSummary:
    path = require_output(layout.ingest.summary, "ingest summary", "ingest", "workload")
    return IngestSummary.from_json(json.loads(path.read_text(encoding="utf-8")))
