"""Writing outputs safely, publishing the ingest outputs as one set, and reading them back.

Every file is written to a temporary name in the same directory and renamed into place, so a
reader never sees half a file and a crash never leaves a corrupt one; files follow the user's
umask. A write that fails (not a folder, not writable, disk full) is an :class:`OutputError`
naming the path, with nothing half-written left published.

A workload folder carries a marker (:attr:`WorkloadLayout.marker`): enginefit writes only into a
new or empty folder or one with its marker, and removes only files it wrote. While a command
writes a workload it holds an advisory lock, so two writers never interleave; where the folder
mirrors one on object storage, also a lease on that one (:class:`pipeline.remote.Lease`), so two
machines' writers take turns too.

The ingest outputs (request parts, quarantine, summary) are one set: they are staged, the old
manifest is removed, they are renamed into place, and the manifest naming every file with its
size (and the quarantine and summary digests) is written last. A reader checks the set against
its manifest, so a set cut short by a kill or mixed from two runs is refused, never read.
``scan_requests`` returns a lazy frame over a workload's request parts (paths:
:mod:`pipeline.layout`), so later stages never load more than they need; :func:`read_requests`
is how every stage after ingest reads the workload's table.

A process keeps at most one large stage input between the steps that share it
(:func:`reuse_input`, :func:`release_input`).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, nullcontext, suppress
from pathlib import Path
from typing import Any, TypeVar

import polars as pl
import pyarrow.parquet as pq

from pipeline.digests import sha256_file
from pipeline.errors import EnginefitError, InputFormatError
from pipeline.layout import PART_NAME, WorkloadLayout, require_output
from pipeline.mirror import push_ingest
from pipeline.remote import Lease, leased
from pipeline.safe_read import read_json
from pipeline.schema import CANONICAL_SCHEMA


class OutputError(EnginefitError):
    """An output cannot be written: not a folder, not writable, disk full, not an enginefit
    workload, or another command is writing it."""


_WHERE_TO = "choose another output folder (--out DIR, or paths.data_dir in the configuration)"
_WRITE_PROBLEMS = {
    errno.ENOSPC: "no space left on the device; free space or " + _WHERE_TO,
    errno.EDQUOT: "disk quota exceeded; free space or " + _WHERE_TO,
    errno.EFBIG: "file too large for the file system; " + _WHERE_TO,
    errno.EACCES: "permission denied; fix the folder's permissions or " + _WHERE_TO,
    errno.EPERM: "permission denied; fix the folder's permissions or " + _WHERE_TO,
    errno.EROFS: "read-only file system; " + _WHERE_TO,
    errno.ENOTDIR: "a file is in the way where a folder is needed; " + _WHERE_TO,
    errno.EEXIST: "a file is in the way where a folder is needed; " + _WHERE_TO,
}
# Polars reports an IO failure as a ComputeError whose text carries the OS error number.
_POLARS_OS_ERROR = re.compile(r"os error (\d+)")


def _write_problem(code: int | None, fallback: str) -> str:
    if code in _WRITE_PROBLEMS:
        return _WRITE_PROBLEMS[code]
    return f"{fallback}; " + _WHERE_TO


@contextmanager
def output_errors(path: Path) -> Iterator[None]:
    """Turn a failed write of ``path`` into one :class:`OutputError` line naming it (the output
    a person knows, not the temporary name it was staged under)."""
    try:
        yield
    except OSError as exc:
        problem = _write_problem(exc.errno, exc.strerror or str(exc))
        raise OutputError(f"{path}: cannot write: {problem}") from exc
    except pl.exceptions.PolarsError as exc:
        found = _POLARS_OS_ERROR.search(str(exc))
        if found is None:
            raise
        code = int(found.group(1))
        problem = _write_problem(code, os.strerror(code))
        raise OutputError(f"{path}: cannot write: {problem}") from exc


def _reserve(folder: Path, prefix: str, *, directory: bool = False) -> Path:
    """A new, empty file (or folder) with a random name; the mode the umask allows, unlike
    ``tempfile``'s private 0600/0700."""
    while True:
        path = folder / f"{prefix}{secrets.token_hex(6)}"
        try:
            if directory:
                path.mkdir(0o777)
            else:
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        except FileExistsError:
            continue
        return path


def reserve_beside(target: Path) -> Path:
    """A new, empty temporary file beside ``target`` (named as :func:`staged_path`'s are, so
    the workload folder's checks know it); the caller removes it."""
    with output_errors(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        return _reserve(target.parent, f".{target.name}.")


@contextmanager
def staged_path(target: Path) -> Iterator[Path]:
    """A temporary path beside ``target``; removed on exit unless the caller renamed it."""
    tmp = reserve_beside(target)
    try:
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_path(target: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; on success it is renamed onto ``target``."""
    with staged_path(target) as tmp, output_errors(target):
        yield tmp
        tmp.replace(target)


def json_bytes(payload: Any) -> bytes:
    return (json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n").encode()


def write_bytes_atomic(target: Path, data: bytes) -> None:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)


def write_json_atomic(target: Path, payload: Any) -> None:
    write_bytes_atomic(target, json_bytes(payload))


def _write_parquet(frame: pl.DataFrame, path: Path, target: Path) -> None:
    # No statistics timestamps or writer-specific metadata vary between runs, so equal frames
    # give equal bytes.
    with output_errors(target):
        frame.write_parquet(path, compression="zstd", statistics=True)


def write_parquet_atomic(frame: pl.DataFrame, target: Path, shown: Path | None = None) -> None:
    """``frame`` to ``target`` at once; an error names ``shown`` (default: ``target``)."""
    with atomic_path(target) as tmp:
        _write_parquet(frame, tmp, shown or target)


def copy_parquet_atomic(source: Path | Sequence[Path], target: Path) -> None:
    """A Parquet file, or several of one schema one after the other, to ``target`` at once,
    one row group in memory at a time."""
    sources = [source] if isinstance(source, Path) else list(source)
    with atomic_path(target) as tmp, output_errors(target):
        schema = pq.ParquetFile(sources[0]).schema_arrow
        with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            for path in sources:
                found = pq.ParquetFile(path)
                for group in range(found.num_row_groups):
                    writer.write_table(found.read_row_group(group))


# ---------------------------------------------------------------------------------------------
# The workload folder: marker, lock, leftovers.

# Workload folders this process holds the lock of (claims nest), with the lease on the folder
# on object storage that it mirrors, if it does.
_HELD: dict[Path, Lease | None] = {}
_LEFTOVER_FILE = re.compile(
    r"^\.(quarantine\.parquet|ingest_summary\.json|ingest_manifest\.json|enginefit-workload)\.[0-9a-f]+$"
)
_STAGING_DIR = re.compile(r"^\.requests\.(old\.|reads\.)?[0-9a-f]+$")
# One source's rows between the step that reads the file and the merge (pipeline.ingest.stage).
STAGED_READS_PREFIX = ".requests.reads."


def _foreign_entries(layout: WorkloadLayout) -> list[str]:
    """What stands in the way of writing ``layout``: a file where the folder goes, a non-empty
    folder without the marker, or files in requests/ that are not request parts."""
    root = layout.root
    if not root.exists():
        return []
    if not root.is_dir():
        raise OutputError(f"{root}: is a file, not a folder; {_WHERE_TO}")
    if not layout.marker.exists():
        return sorted(
            p.name
            for p in root.iterdir()
            if p != layout.lock and not _written_by_a_later_stage(layout, p)
        )
    requests = layout.ingest.requests
    if requests.is_dir() and not requests.is_symlink():
        return sorted(
            f"requests/{p.name}"
            for p in requests.iterdir()
            if not (PART_NAME.match(p.name) and p.is_file() and not p.is_symlink())
        )
    return [requests.name] if requests.exists() else []


def _written_by_a_later_stage(layout: WorkloadLayout, entry: Path) -> bool:
    """``entry`` is a stage folder (shape/, bench/, ...) holding only that stage's outputs (and
    their temporary files): what a stage run before ingest (bench results) leaves, and nothing
    ingest replaces."""
    stages = (
        layout.shape,
        layout.prefix,
        layout.simulation,
        layout.bench,
        layout.capacity,
        layout.decision,
    )
    known = next((set(s.files().values()) for s in stages if s.dir == entry), None)
    if known is None or entry.is_symlink() or not entry.is_dir():
        return False
    temporaries = {f".{k.name}." for k in known}
    for path in entry.rglob("*"):
        is_scenario = path.parent in known and path.suffix == ".json"
        is_temporary = any(path.name.startswith(prefix) for prefix in temporaries)
        if not (path in known or is_scenario or is_temporary):
            return False
    return True


def check_output_folder(layout: WorkloadLayout) -> None:
    """Refuse, before any work, a folder enginefit may not write a workload into."""
    foreign = _foreign_entries(layout)
    if not foreign:
        return
    shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
    if not layout.marker.exists():
        older = " (if an older enginefit wrote it, delete it and ingest again)"
        raise OutputError(
            f"{layout.root}: folder is not empty and not an enginefit workload (no "
            f"{layout.marker.name} marker; holds {shown}); enginefit never replaces files it did "
            f"not write: {_WHERE_TO}{older if layout.ingest.summary.exists() else ''}"
        )
    raise OutputError(
        f"{layout.root}: holds {shown}, which enginefit did not write; move them out of the "
        f"workload folder or {_WHERE_TO}"
    )


def _mark(layout: WorkloadLayout) -> None:
    if not layout.marker.exists():
        write_bytes_atomic(
            layout.marker, b"enginefit workload: enginefit wrote this folder's outputs\n"
        )


def open_stage_output(layout: WorkloadLayout) -> None:
    """Before a stage after ingest writes into ``layout`` (the configured workload, or an ad-hoc
    ``--out DIR``): the folder must be new, empty or enginefit's, and is marked as enginefit's.
    No lock: the stages of one workload may run side by side (Dagster's multiprocess executor),
    each writing only its own subfolder, atomically."""
    check_output_folder(layout)
    with output_errors(layout.root):
        layout.root.mkdir(parents=True, exist_ok=True)
    _mark(layout)


@contextmanager
def claim_workload(layout: WorkloadLayout, keep: Collection[Path] = ()) -> Iterator[None]:
    """Hold ``layout``'s folder for writing: checked, locked (refused if another command holds
    it), marked as an enginefit workload, cleared of staging leftovers (but the staging folders
    ``keep``: what the body is about to read). Claims nest. If the body fails before writing
    anything, the folders this claim created are removed again."""
    key = layout.root.absolute()
    if key in _HELD:
        yield
        return
    check_output_folder(layout)
    created = [p for p in (key, *key.parents) if not p.exists()]
    with output_errors(layout.root):
        layout.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(layout.lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputError(
                f"{layout.root}: another enginefit command is writing this workload (it holds "
                f"{layout.lock.name}); wait for it to finish, or write elsewhere with --out DIR"
            ) from None
        check_output_folder(layout)  # again, now that no other writer can change it
        _mark(layout)
        _remove_leftovers(layout, keep)
        # Another machine's writer of the same folder on object storage: waited for.
        remote = leased(layout.remote.remote, layout.lock.name) if layout.remote else nullcontext()
        with remote as lease:
            _HELD[key] = lease
            try:
                yield
            except BaseException:
                if created:
                    _remove_if_unused(layout, created)
                raise
            finally:
                del _HELD[key]
    finally:
        os.close(fd)


def _remove_if_unused(layout: WorkloadLayout, created: list[Path]) -> None:
    """Undo a claim that wrote nothing: its marker, lock and the folders it made, if nothing
    else is in them."""
    if {p.name for p in layout.root.iterdir()} - {layout.marker.name, layout.lock.name}:
        return
    layout.marker.unlink(missing_ok=True)
    layout.lock.unlink(missing_ok=True)
    for folder in created:  # deepest first
        with suppress(OSError):
            folder.rmdir()


def _remove_parts(folder: Path) -> None:
    """Remove the request parts in ``folder`` (only those: anything else stays), then the folder
    if that emptied it."""
    if not folder.is_dir() or folder.is_symlink():
        return
    for path in folder.iterdir():
        if PART_NAME.match(path.name) and path.is_file():
            path.unlink()
    with suppress(OSError):  # something enginefit did not write is inside: leave it
        folder.rmdir()


def remove_staged_reads(folder: Path) -> None:
    """A staged read's folder (:func:`pipeline.ingest.stage.stage_read`) once it is merged."""
    with output_errors(folder):
        _remove_parts(folder)


def remove_ingest_set(layout: WorkloadLayout) -> None:
    """An ingest set enginefit published in a folder of its own (manifest first, so what is left
    of it reads as incomplete), then the folder if nothing else is in it."""
    paths = layout.ingest
    with output_errors(layout.root):
        paths.manifest.unlink(missing_ok=True)
        _remove_parts(paths.requests)
        for path in (paths.quarantine, paths.summary, layout.marker, layout.lock):
            path.unlink(missing_ok=True)
        with suppress(OSError):  # something enginefit did not write is inside: leave it
            layout.root.rmdir()


def _remove_leftovers(layout: WorkloadLayout, keep: Collection[Path] = ()) -> None:
    """Staging folders and temporary files a killed ingest left (only names enginefit makes)."""
    kept = {path.absolute() for path in keep}
    with output_errors(layout.root):
        for path in layout.root.iterdir():
            if path.absolute() in kept:
                continue
            if path.is_dir() and not path.is_symlink() and _STAGING_DIR.match(path.name):
                _remove_parts(path)
            elif path.is_file() and _LEFTOVER_FILE.match(path.name):
                path.unlink()


# ---------------------------------------------------------------------------------------------
# The ingest set: published together, checked on read.


def _file_entry(path: Path) -> dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def _link_or_copy(source: Path, target: Path, shown: Path) -> None:
    """``target`` as a hard link to ``source`` (no copy), else a copy where links are refused."""
    with output_errors(shown):
        try:
            os.link(source, target)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                raise
            shutil.copyfile(source, target)


def publish_ingest(
    layout: WorkloadLayout,
    parts: Iterable[pl.DataFrame | Path],
    quarantine: pl.DataFrame | None = None,
    summary: dict[str, Any] | None = None,
    *,
    extra: dict[str, Any] | None = None,
) -> list[Path]:
    """Replace the workload's ingest outputs with ``parts`` (and the quarantine and summary, or
    none) as one set. Everything is staged first, so a failure leaves the previous set intact;
    from the old manifest's removal to the new one's rename the set reads as incomplete.

    A part given as a path is a request part written already (a day's,
    :mod:`pipeline.ingest.days`), published in its place as a hard link, not a copy. Parts are
    taken one at a time, so an iterator that makes each when asked holds one part at most. ``extra``:
    more manifest keys (lineage a reader does not check)."""
    paths = layout.ingest
    with claim_workload(layout), ExitStack() as staged:
        with output_errors(paths.dir):
            staging = _reserve(paths.dir, ".requests.", directory=True)
        staged.callback(_remove_parts, staging)  # a no-op once it became requests/
        for index, part in enumerate(parts):
            staged_part, shown = staging / paths.part(index).name, paths.part(index)
            if isinstance(part, Path):
                _link_or_copy(part, staged_part, shown)
            else:
                _write_parquet(part, staged_part, shown)
        manifest: dict[str, Any] = {
            "parts": {p.name: p.stat().st_size for p in sorted(staging.iterdir())},
            "quarantine": None,
            "summary": None,
            **(extra or {}),
        }
        renames = []
        if quarantine is not None:
            tmp = staged.enter_context(staged_path(paths.quarantine))
            _write_parquet(quarantine, tmp, paths.quarantine)
            manifest["quarantine"] = _file_entry(tmp)
            renames.append((tmp, paths.quarantine))
        if summary is not None:
            tmp = staged.enter_context(staged_path(paths.summary))
            with output_errors(paths.summary):
                tmp.write_bytes(json_bytes(summary))
            manifest["summary"] = _file_entry(tmp)
            renames.append((tmp, paths.summary))
        manifest_tmp = staged.enter_context(staged_path(paths.manifest))
        with output_errors(paths.manifest):
            manifest_tmp.write_bytes(json_bytes(manifest))
        with output_errors(paths.dir):
            paths.manifest.unlink(missing_ok=True)
            old = _reserve(paths.dir, ".requests.old.", directory=True)
            if paths.requests.exists():
                paths.requests.replace(old)
            staging.rename(paths.requests)
            for name in ("quarantine", "summary"):
                if manifest[name] is None:  # an older set's file, enginefit's own
                    getattr(paths, name).unlink(missing_ok=True)
            for tmp, target in renames:
                tmp.replace(target)
            manifest_tmp.replace(paths.manifest)
            _remove_parts(old)
        if layout.remote is not None:
            written = [getattr(paths, n) for n in ("quarantine", "summary") if manifest[n]]
            lease = _HELD[layout.root.absolute()]
            push_ingest(layout.remote, paths.manifest, [*paths.parts(), *written], lease)
    return paths.parts()


def _inconsistent(layout: WorkloadLayout, problem: str) -> InputFormatError:
    return InputFormatError(
        f"{layout.root}: ingest outputs are incomplete or from different runs ({problem}); "
        "re-run `enginefit ingest` for this workload (or materialise `workload`)"
    )


def verify_ingest(layout: WorkloadLayout, *, summary_only: bool = False) -> None:
    """Check the workload's ingest outputs against their manifest (one error naming what is off);
    ``summary_only``: the summary alone, for a reader of nothing else (the set's other files
    need not be on this machine)."""
    paths = layout.ingest
    if not paths.manifest.exists():
        if not (paths.requests.exists() or paths.summary.exists()):
            require_output(paths.requests, "canonical request table", "ingest", "workload")
        raise _inconsistent(layout, f"no {paths.manifest.name}: interrupted, or an older version")
    try:
        manifest = read_json(paths.manifest)
        expected_parts = dict(manifest["parts"])
    except (InputFormatError, ValueError, KeyError, TypeError) as exc:
        raise _inconsistent(layout, f"{paths.manifest.name} unreadable") from exc
    found_parts = {} if summary_only else {p.name: p.stat().st_size for p in paths.parts()}
    if found_parts != expected_parts and not summary_only:
        differ = {name for name, _ in set(found_parts.items()) ^ set(expected_parts.items())}
        names = ", ".join(f"{paths.requests.name}/{name}" for name in sorted(differ))
        raise _inconsistent(layout, f"request parts differ from the manifest: {names}")
    for name in ("summary",) if summary_only else ("quarantine", "summary"):
        path: Path = getattr(paths, name)
        entry = manifest.get(name)
        if entry is None:
            if path.exists():
                raise _inconsistent(layout, f"{path.name} is not part of the last ingest")
        elif not path.exists() or _file_entry(path) != entry:
            raise _inconsistent(layout, f"{path.name} differs from the manifest")


# ---------------------------------------------------------------------------------------------
# Reading canonical Parquet.


def parquet_schema(path: Path) -> dict[str, pl.DataType]:
    """The schema in a Parquet file's footer; a file whose footer cannot be read (truncated,
    overwritten) is an error naming it, never taken for another format."""
    try:
        return pl.read_parquet_schema(path)
    except (pl.exceptions.PolarsError, OSError) as exc:
        problem = " ".join(str(exc).split())
        raise InputFormatError(
            f"{path}: damaged Parquet file ({problem}); restore it, or re-create it (a "
            "workload's requests/: re-run `enginefit ingest`, or materialise `workload`)"
        ) from exc


def is_canonical_parquet(path: Path) -> bool:
    """True for a canonical Parquet file or a directory of them (a workload dir or its requests/).
    Raises for a damaged Parquet file among them, naming it."""
    files = parquet_files(path)
    if not files:
        return False
    schemas = [parquet_schema(file) for file in files]
    return all(schemas[0].get(name) == dtype for name, dtype in CANONICAL_SCHEMA.items())


def parquet_files(path: Path) -> list[Path]:
    if path.is_dir():
        inner = WorkloadLayout(path).ingest.requests
        root = inner if inner.is_dir() else path
        return sorted(p for p in root.glob("*.parquet") if not p.name.startswith("."))
    return [path] if path.suffix == ".parquet" or _has_parquet_magic(path) else []


def _has_parquet_magic(path: Path) -> bool:
    if not path.is_file():  # opening a FIFO would block; the readers refuse it with a reason
        return False
    try:
        with path.open("rb") as handle:
            return handle.read(4) == b"PAR1"
    except OSError:
        return False


def canonical_files(path: Path) -> list[Path]:
    """:func:`parquet_files`, after checking a workload folder enginefit wrote (it has the
    marker) against its manifest."""
    layout = WorkloadLayout(path)
    if path.is_dir() and layout.marker.exists():
        verify_ingest(layout)
    return parquet_files(path)


def scan_requests(path: Path) -> pl.LazyFrame:
    """Lazily scan a canonical request table: a workload dir, its requests/ dir, or one file."""
    files = canonical_files(path)
    if not files:
        raise InputFormatError(f"{path}: no canonical Parquet request files found")
    for file in files:
        parquet_schema(file)  # a damaged part is named here, not met mid-computation
    return pl.scan_parquet(files, schema=CANONICAL_SCHEMA)


def read_requests(layout: WorkloadLayout) -> pl.LazyFrame:
    """The canonical request table of a workload, scanned lazily (checked against its manifest)."""
    verify_ingest(layout)
    return scan_requests(layout.ingest.requests)


# ---------------------------------------------------------------------------------------------
# The one large stage input a process keeps.
#
# A Dagster run whose steps share a process (``enginefit report``'s in-process executor) runs the
# simulation's scenario steps one after another on the same flattened workload: keeping it saves
# flattening and numbering its blocks once per step. Only one input is kept, of any stage, so a
# process never holds two workloads' arrays; a stage that loads a large input of its own calls
# :func:`release_input` first, so what the previous stage kept is not held beside it (at 10M
# requests each is gigabytes).

T = TypeVar("T")

_KEPT: dict[Hashable, Any] = {}


def reuse_input(key: Hashable, build: Callable[[], T]) -> T:
    """The input kept under ``key``, else ``build()``'s, kept in place of whatever was."""
    if key in _KEPT:
        kept: T = _KEPT[key]
        return kept
    _KEPT.clear()  # before building: the old input's memory is free for the new one
    value = _KEPT[key] = build()
    return value


def release_input() -> None:
    """Let go of the kept input."""
    _KEPT.clear()
