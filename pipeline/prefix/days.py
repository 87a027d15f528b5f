"""Prefix sharing of a workload published from days, carried on from the days read before.

The analysis (:mod:`pipeline.prefix.analysis`) is a few passes over the table in arrival order,
each carrying state from request to request (the sessions' open conversations, the curve's
hashes, the replays' tables), so a day cannot be analysed on its own. What a day can have of
its own is its summary (what the passes must know first: counts, arrival span, prompt lengths,
block size, namespaces and tenants), kept in ``prefix/resume/days/`` and merged; and each pass
is kept at the end of the last day (:meth:`pipeline.resume.DayPasses.carried`, in
``prefix/resume/<pass>/``) and fed only the days appended since. The first pass writes each
part's sessions to a file of its own beside its state (``sessions/``, named by their digest),
and the stage's ``sessions.parquet`` is those files one after the other. So a day appended
reads that day's chains (and its summary's columns), not the quarter's; the files are those of
an analysis of every day (``tests/test_prefix_days.py``).

A pass is not carried on, and reads every day again, when a day it covers changed, when the
settings or code did, or when the whole table's facts it depends on did: the block size, the
first arrival, the (model, adapter) namespaces or tenants (numbered over the table), the
curve's windows (its longest prompt) or sample rate, a replay's sample rate (each a power of
two, so it stays put until the table doubles; :func:`pipeline.prefix.replay.power_of_two_rate`).
One line per pass says which (``enginefit prefix``, the asset's ``resumed`` metadata).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import pickle
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.errors import EnginefitError
from pipeline.ingest.days import UnitedDay
from pipeline.mirror import fetched_bytes, files_below, folders_below, push_file
from pipeline.prefix.analysis import (
    PASS_NAMES,
    SESSIONS_IN_MEMORY_MAX,
    TableSummary,
    analysed,
    plan_of,
)
from pipeline.prefix.config import PrefixConfig
from pipeline.prefix.result import PrefixResult
from pipeline.prefix.sessions import SESSIONS_SCHEMA, FlatLists, SessionStream, check_min_blocks
from pipeline.remote import Mirror, StorageError
from pipeline.resume import DayPasses, code_digest, forget_kept
from pipeline.schema import empty_canonical
from pipeline.store import scan_requests, write_bytes_atomic

SUMMARIES = "days"
SESSIONS = "sessions"
_SUMMARY_FILE = re.compile(r"^\d{4}-\d{2}-\d{2}\.pickle$")
_SESSIONS_FILE = re.compile(r"^\d{6}-[0-9a-f]{16}\.parquet$")


@dataclass
class DaySessions:
    """The first pass's sessions, a file for each part of the table (in ``folder/sessions/``,
    named by its order and digest, so a file another run wrote is never taken for this one's):
    ``kept_files`` every file so far, ``fresh_files`` those this process wrote."""

    folder: Path
    kept_files: list[str] = field(default_factory=list)
    fresh_files: list[str] = field(default_factory=list)
    _frames: list[pl.DataFrame] = field(default_factory=list)

    @property
    def wants_ids(self) -> bool:
        return True

    def feed(self, stream: SessionStream, chunk: pl.DataFrame, native: FlatLists) -> None:
        self._frames.append(stream.frame(chunk["request_id"], stream.feed_codes(chunk, native)))

    def part_done(self) -> None:
        frame = pl.concat(self._frames) if self._frames else pl.DataFrame(schema=SESSIONS_SCHEMA)
        self._frames = []
        buffer = io.BytesIO()
        frame.write_parquet(buffer, compression="zstd")
        data = buffer.getvalue()
        name = f"{SESSIONS}/{len(self.kept_files):06d}-{hashlib.sha256(data).hexdigest()[:16]}"
        name += ".parquet"
        (self.folder / SESSIONS).mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(self.folder / name, data)
        self.kept_files.append(name)
        self.fresh_files.append(name)

    def __getstate__(self) -> dict[str, Any]:
        # kept between parts only: no chunk of a part half read; what this process wrote is
        # this process's to upload
        assert not self._frames, "a pass is kept between parts"
        return {"folder": self.folder, "kept_files": self.kept_files}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.folder = state["folder"]
        self.kept_files = state["kept_files"]
        self.fresh_files = []
        self._frames = []

    def frame(self, requests: int) -> tuple[pl.LazyFrame, tuple[Path, ...]]:
        """Every part's sessions in order: read into memory up to ``SESSIONS_IN_MEMORY_MAX``
        requests (the frame an analysis of the whole table makes), else a scan of the files,
        returned to be copied into place (``PrefixResult.sessions_files``)."""
        files = tuple(self.folder / f for f in self.kept_files)
        if not files:
            return pl.DataFrame(schema=SESSIONS_SCHEMA).lazy(), ()
        if requests <= SESSIONS_IN_MEMORY_MAX:
            return pl.read_parquet(list(files)).lazy(), ()
        return pl.scan_parquet(list(files)), files

    def tidy(self, remote: Mirror | None) -> None:
        """Remove the sessions files that the pass does not name (another run's, or those of
        the days before a day changed), here and in the bucket."""
        named = {Path(f).name for f in self.kept_files}
        # in the bucket, only a run that wrote some can have left others
        bucket = remote if self.fresh_files else None
        _remove_unnamed(self.folder / SESSIONS, bucket, _SESSIONS_FILE, named)


def _placed(plan: Any) -> Callable[[Any, Path], None]:
    """How a first pass read back is told what changed since it was kept: it writes its
    sessions in its folder as it is now, and its curve takes the windows of the table's
    longest prompt now."""

    def placed(first: Any, folder: Path) -> None:
        first.sessions.folder = folder
        if first.counter is not None:
            first.counter.widen(plan.max_prompt)

    return placed


def analyse_days(daily: DayPasses, config: PrefixConfig) -> PrefixResult:
    """:func:`pipeline.prefix.analysis.analyse` of the union ``daily`` reads (its parts, in
    arrival order), each pass carried on from the days it covered (``daily.said``: one line a
    pass); the summary, curve and sessions equal an analysis of every day's."""
    check_min_blocks(config.min_session_match_blocks)
    summaries = day_summaries(daily)
    plan = plan_of(TableSummary.merged(summaries), config, by_parts=True)
    summary, curve, first = analysed(plan, config, daily, DaySessions, _placed(plan))
    sessions: DaySessions = first.sessions  # type: ignore[assignment]
    if daily.keeps:
        sessions.tidy(daily.remote)
        forget_passes(daily.folder, daily.remote, keep=daily.used)
    frame, files = sessions.frame(plan.n)
    return PrefixResult.from_json(summary, curve, frame, files)


def forget_passes(folder: Path, remote: Mirror | None, keep: Collection[str] = ()) -> None:
    """Remove the prefix passes kept in ``folder`` but those named in ``keep`` (a pass the
    table no longer needs, e.g. the sampled replay when the shared one is exact again), here
    and in the bucket; with nothing to keep (the workload no longer a union of days) the day
    summaries too."""
    held = folders_below(folder, remote)
    for name in PASS_NAMES:
        if name in held and name not in keep:
            forget_kept(folder / name, remote)
    if not keep:
        _remove_unnamed(folder / SUMMARIES, remote, _SUMMARY_FILE, set())
        with contextlib.suppress(OSError):
            (folder / SUMMARIES).rmdir()
            folder.rmdir()


def _remove_unnamed(
    folder: Path, remote: Mirror | None, pattern: re.Pattern[str], named: set[str]
) -> None:
    """Remove the files of ``folder`` named as this module names them (``pattern``) but not
    in ``named``, here and, with ``remote``, in the bucket."""
    for path in folder.iterdir() if folder.is_dir() else ():
        if pattern.match(path.name) and path.name not in named:
            path.unlink(missing_ok=True)
    if remote is not None:
        for name, key in files_below(folder, remote).items():
            if pattern.match(name) and name not in named:
                remote.remote.delete(key)


def day_summaries(daily: DayPasses) -> list[TableSummary]:
    """Each day's :class:`TableSummary`, read back from ``prefix/resume/days/`` (here, else in
    the bucket) when kept for that day's set (same digest, same code), else made from the
    day's parts and kept. Days no longer in the union have theirs removed."""
    folder = daily.folder / SUMMARIES
    found: list[TableSummary] = []
    first = 0
    for day in daily.days:
        parts = daily.parts[first : first + day.parts]
        first += day.parts
        found.append(_day_summary(folder / f"{day.day}.pickle", day, parts, daily))
    if daily.keeps:
        _remove_unnamed(
            folder, daily.remote, _SUMMARY_FILE, {f"{d.day}.pickle" for d in daily.days}
        )
    if not found:
        found.append(TableSummary.of(empty_canonical().lazy()))
    return found


def _day_summary(
    path: Path, day: UnitedDay, parts: tuple[Path, ...], daily: DayPasses
) -> TableSummary:
    """The day's summary kept in ``path``, else the bucket's (another machine's), else made
    from its parts (and kept, here and in the bucket)."""
    key = (code_digest(), day.day, day.digest)
    summary = _kept_summary(path.read_bytes() if path.is_file() else None, key)
    if summary is not None:
        return summary
    remote = daily.remote
    with contextlib.suppress(StorageError):  # not fetched: made here
        data = fetched_bytes(remote, path) if remote is not None else None
        summary = _kept_summary(data, key)
        if summary is not None:
            if daily.keeps:
                _keep(path, data)  # type: ignore[arg-type]
            return summary
    summary = TableSummary.merged([TableSummary.of(scan_requests(p)) for p in parts])
    if daily.keeps and _keep(path, pickle.dumps((key, summary), pickle.HIGHEST_PROTOCOL)):
        with contextlib.suppress(StorageError):  # another machine makes its own
            if remote is not None:
                push_file(remote, path)
    return summary


def _kept_summary(data: bytes | None, key: tuple[str, str, str]) -> TableSummary | None:
    """The summary ``data`` holds when it was kept under ``key`` (the day's set and code)."""
    if data is None:
        return None
    with contextlib.suppress(Exception):  # any file but this day's own is made again
        # written by this stage, read from the workload's own folder or its bucket
        kept_key, kept = pickle.loads(data)
        if kept_key == key and isinstance(kept, TableSummary):
            return kept
    return None


def _keep(path: Path, data: bytes) -> bool:
    """``data`` written to ``path`` (a cache: False when it could not be, the analysis
    stands)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, data)
    except (OSError, EnginefitError):
        return False
    return True
