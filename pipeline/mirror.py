"""Workload and report folders kept on object storage, worked on through a local mirror.

Every stage keeps working on a local folder (:mod:`pipeline.store`'s atomic renames, seals,
manifests and locks are unchanged); with ``paths.data_dir`` or ``paths.reports_dir`` an
``s3://`` URL, that folder is a mirror under ``paths.cache_dir`` and this module moves the
committed sets between the two. A set is committed by its marker, the file written last: a
stage's seal (``.<asset>.sha256.json``, :meth:`pipeline.results.Result.seal`) or the ingest
manifest; a report version by its ``manifest.json``.

* **Push** (after a stage seals, after ingest publishes): the set's data files are uploaded
  first and its marker last, so a reader on another machine never takes a half-uploaded set for
  a whole one (the ingest manifest is deleted first, as the local publication removes it).
* **Pull** (when a step starts working on the workload, :func:`pull`): every marker on the
  remote that the step reads (:data:`Wanted`; a command: every marker) and that differs from
  the one this machine last saw is fetched with the files it names (or of them, those the step
  reads: the ingest summary without the request parts), each checked against the digest (or
  size) the marker records, then the marker is written; a file the local copy already holds is
  not fetched again. What this machine last saw of each marker is kept outside the mirror, so
  a local set written but not yet pushed is never replaced by the older remote one; a set
  fetched in part is not recorded as seen, so a step that reads the rest fetches it.
* **Report versions** are uploaded with a conditional put (``If-None-Match: *``): a version
  another run published under the same key is refused, never overwritten.
* **Writers on two machines** of the same ingest set (a day's, the workload's union) take
  turns: the writer holds a lease on the folder in the bucket (:class:`~pipeline.remote.Lease`,
  taken in :func:`pipeline.store.claim_workload`) and confirms it before it touches the set and
  again before it commits the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from pipeline.digests import sha256_file
from pipeline.errors import StageOutputUnreadableError
from pipeline.remote import Lease, Mirror, StorageError

_SEAL = re.compile(r"^\.[A-Za-z0-9_]+\.sha256\.json$")
INGEST_MANIFEST = "ingest_manifest.json"
WORKLOAD_MARKER = ".enginefit-workload"
_PART = re.compile(r"^part-\d{5}\.parquet$")
_VERSION_FILE = re.compile(r"^\d{4}-Q[1-4]/v[1-9]\d*/[^/]+$")
REPORT_LEDGER = "index.json"
REPORT_MANIFEST = "manifest.json"


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sha256_file(path: Path) -> str | None:
    return sha256_file(path) if path.is_file() else None


def _write_atomic(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.mirror-{os.getpid()}")
    try:
        tmp.write_bytes(data)
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)


def _seen(mirror: Mirror, relative: str) -> str | None:
    """The sha256 of the marker ``relative`` as this machine last pushed or pulled it."""
    try:
        return (mirror.state / f"{relative}.seen").read_text().strip() or None
    except OSError:
        return None


def _saw(mirror: Mirror, relative: str, digest: str | None) -> None:
    record = mirror.state / f"{relative}.seen"
    if digest is None:
        record.unlink(missing_ok=True)
    else:
        _write_atomic(record, f"{digest}\n".encode())


def _relative(mirror: Mirror, path: Path) -> str:
    return path.relative_to(mirror.local).as_posix()


def folders_below(folder: Path, mirror: Mirror | None) -> set[str]:
    """The names of the folders right below ``folder`` on this machine and, when ``mirror``
    holds it, in the bucket (each key's first part below it; the caller matches the names it
    wrote)."""
    names = {f.name for f in folder.iterdir() if f.is_dir()} if folder.is_dir() else set()
    if mirror is not None:
        relative = _relative(mirror, folder)
        names |= {key[len(relative) + 1 :].split("/", 1)[0] for key in mirror.remote.list(relative)}
    return names


def files_below(folder: Path, mirror: Mirror) -> dict[str, str]:
    """The files anywhere below ``folder`` in the bucket: each one's path below it, by its key
    (a caller removes what it wrote and no longer names)."""
    relative = _relative(mirror, folder)
    return {key[len(relative) + 1 :]: key for key in mirror.remote.list(relative)}


def fetched_bytes(mirror: Mirror, path: Path) -> bytes | None:
    """The bucket's copy of ``path`` (None when it holds none)."""
    return mirror.remote.get(_relative(mirror, path))


# ---------------------------------------------------------------------------------------------
# Push: data files first, the marker last.


def push_set(mirror: Mirror, files: Iterable[Path], marker: Path) -> None:
    """Upload ``files`` (in the mirror), then the ``marker`` that commits them."""
    data = marker.read_bytes()
    push_committed(mirror, [p for p in sorted(set(files) - {marker}) if p.is_file()], marker, data)
    _saw(mirror, _relative(mirror, marker), _sha256_bytes(data))


def push_committed(mirror: Mirror, files: Iterable[Path], marker: Path, data: bytes) -> None:
    """Upload ``files`` (in the mirror), then ``data`` as ``marker``, which commits them. A
    caller that writes ``marker`` here only afterwards keeps nothing committed here whose
    upload failed, so making it again uploads it."""
    for path in files:
        mirror.remote.put(_relative(mirror, path), path)
    mirror.remote.put(_relative(mirror, marker), data)


def push_file(mirror: Mirror, path: Path) -> None:
    """Upload one file no marker commits (what a step hands the next in the same stage)."""
    mirror.remote.put(_relative(mirror, path), path)


def push_ingest(mirror: Mirror, manifest: Path, files: Iterable[Path], lease: Lease | None) -> None:
    """Upload an ingest set as the local publication does it: the old manifest removed first
    (the set reads as incomplete meanwhile), the files, the new manifest, then the request
    parts of an older set that the new one does not name. ``lease``: this machine's on the
    folder (:func:`pipeline.store.claim_workload`), confirmed before the set is touched and
    again before it is committed, so a writer that lost it to another machine commits nothing."""
    marker = _relative(mirror, manifest)
    folder = marker.rsplit("/", 1)[0] + "/" if "/" in marker else ""
    if lease is not None:
        lease.confirm()
    mirror.remote.delete(marker)
    wanted = {_relative(mirror, p) for p in files}
    for path in sorted(files):
        mirror.remote.put(_relative(mirror, path), path)
    data = manifest.read_bytes()
    if lease is not None:
        lease.confirm()
    mirror.remote.put(marker, data)
    _saw(mirror, marker, _sha256_bytes(data))
    for name in mirror.remote.list(f"{folder}requests"):
        relative = f"{folder}{name}" if folder else name
        if relative not in wanted and _PART.match(name.rsplit("/", 1)[-1]):
            mirror.remote.delete(relative)


def publish_version(mirror: Mirror, version: Path) -> None:
    """Upload a report version folder under keys never written before: every file, the
    manifest last, each with ``If-None-Match: *``. A key that exists (another run published
    this version) is a :class:`StorageError`; nothing it holds is replaced."""
    files = sorted(p for p in version.iterdir() if p.is_file())
    files.sort(key=lambda p: p.name == REPORT_MANIFEST)  # the manifest commits the version
    for path in files:
        relative = _relative(mirror, path)
        if not mirror.remote.put_new(relative, path.read_bytes()):
            raise StorageError(
                f"{mirror.remote.where(relative)}: another enginefit run published this "
                "version meanwhile; run again (published versions are never replaced)"
            )


def push_ledger(mirror: Mirror, ledger: Path) -> None:
    data = ledger.read_bytes()
    mirror.remote.put(_relative(mirror, ledger), data)
    _saw(mirror, _relative(mirror, ledger), _sha256_bytes(data))


# ---------------------------------------------------------------------------------------------
# Pull: markers that changed, with what they name.


#: What a step reads of a workload folder: each committed set by its marker (relative to the
#: folder; a folder ending in '/' stands for every marker below it), with the files of the set
#: it reads (None: every one).
Wanted = Mapping[str, Collection[str] | None]


def _is_marker(relative: str) -> bool:
    name = relative.rsplit("/", 1)[-1]
    return bool(_SEAL.match(name)) or name == INGEST_MANIFEST


def pull_workload(mirror: Mirror, wanted: Wanted | None = None) -> None:
    """Bring the local workload folder up to the remote one's committed sets: every one, or
    those ``wanted`` names (and of each, the files it names)."""
    markers: dict[str, Collection[str] | None] = {}
    for key, files in ({"": None} if wanted is None else wanted).items():
        if key and not key.endswith("/"):
            markers[key] = files
            continue
        below = mirror.remote.list(key.rstrip("/"))
        markers |= {relative: files for relative in sorted(below) if _is_marker(relative)}
    for relative, files in markers.items():
        named = _ingest_files if relative.endswith(INGEST_MANIFEST) else _sealed_files
        _pull_marker(mirror, relative, named, files)


def _mark_mirror(mirror: Mirror) -> None:
    marker = mirror.local / WORKLOAD_MARKER
    if not marker.exists():
        _write_atomic(marker, b"enginefit workload: enginefit wrote this folder's outputs\n")


def _pull_marker(
    mirror: Mirror, relative: str, named: Any, files: Collection[str] | None = None
) -> None:
    """The set ``relative`` commits, or of it the ``files`` named (and its marker, which they
    are checked against here: the set is not recorded as seen, as it is not whole here)."""
    for _ in range(3):  # a set being pushed again meanwhile: its marker moves; fetch again
        data = mirror.remote.get(relative)
        if data is None:
            return
        digest = _sha256_bytes(data)
        local = mirror.local / relative
        if _seen(mirror, relative) == digest and local.is_file():
            return
        folder = relative.rsplit("/", 1)[0] + "/" if "/" in relative else ""
        try:
            expected: dict[str, tuple[str, Any]] = named(json.loads(data))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise StageOutputUnreadableError(
                f"{mirror.remote.where(relative)}: not a seal or manifest enginefit wrote; "
                "re-run the stage that writes it"
            ) from exc
        if files is not None:
            expected = {name: check for name, check in expected.items() if name in files}
        if not all(_fetch(mirror, folder + name, check) for name, check in expected.items()):
            continue
        _mark_mirror(mirror)
        if files is None and relative.endswith(INGEST_MANIFEST):
            _drop_other_parts(mirror.local / folder / "requests", expected)
        _write_atomic(local, data)
        if files is None:
            _saw(mirror, relative, digest)
        return
    raise StageOutputUnreadableError(
        f"{mirror.remote.where(relative)}: the files it names do not match it (another "
        "machine is writing them, or they were changed by hand); run again once that run has "
        "finished, or re-run the stage that writes them"
    )


def _sealed_files(seal: Any) -> dict[str, tuple[str, Any]]:
    return {str(name): ("sha256", digest) for name, digest in seal["sha256"].items()}


def _ingest_files(manifest: Any) -> dict[str, tuple[str, Any]]:
    files: dict[str, tuple[str, Any]] = {
        f"requests/{name}": ("bytes", size) for name, size in manifest["parts"].items()
    }
    for name, file in (("quarantine", "quarantine.parquet"), ("summary", "ingest_summary.json")):
        if manifest.get(name) is not None:
            files[file] = ("sha256", manifest[name]["sha256"])
    return files


def _matches(path: Path, check: tuple[str, Any]) -> bool:
    kind, value = check
    if kind == "bytes":
        return path.is_file() and path.stat().st_size == int(value)
    return _sha256_file(path) == str(value)


def _fetch(mirror: Mirror, relative: str, check: tuple[str, Any]) -> bool:
    """The file in the mirror as the marker records it (fetched unless it already is); False
    when what the remote holds differs (being written again)."""
    if ".." in relative.split("/") or relative.startswith("/"):
        raise StageOutputUnreadableError(f"{mirror.remote.where(relative)}: outside the folder")
    target = mirror.local / relative
    if check[0] == "sha256" and _matches(target, check):
        return True
    mirror.remote.download(relative, target)
    return _matches(target, check)


def _drop_other_parts(requests: Path, expected: dict[str, tuple[str, Any]]) -> None:
    """Request parts of an older set the pulled manifest does not name (a reader would refuse
    the set with them)."""
    if not requests.is_dir():
        return
    for path in requests.iterdir():
        if _PART.match(path.name) and f"requests/{path.name}" not in expected:
            path.unlink()


def pull_reports(mirror: Mirror) -> None:
    """Bring the local report folder up to the remote one: the ledger, and each published
    version this machine does not hold yet (versions never change: one fetched is kept)."""
    listing = mirror.remote.list()
    versions = sorted(r for r in listing if _VERSION_FILE.match(r))
    # Per version, its manifest last: a version folder here is whole or without a manifest.
    versions.sort(key=lambda r: (r.rsplit("/", 1)[0], r.endswith("/" + REPORT_MANIFEST)))
    for relative in versions:
        target = mirror.local / relative
        if not (target.is_file() and target.stat().st_size == listing[relative]):
            mirror.remote.download(relative, target)
    if REPORT_LEDGER in listing:
        data = mirror.remote.get(REPORT_LEDGER)
        if data is not None and _seen(mirror, REPORT_LEDGER) != _sha256_bytes(data):
            _write_atomic(mirror.local / REPORT_LEDGER, data)
            _saw(mirror, REPORT_LEDGER, _sha256_bytes(data))


def forget_version(version: Path) -> None:
    """Remove a version folder from the mirror that the remote refused (another run's)."""
    shutil.rmtree(version, ignore_errors=True)


def pull(layout: Any, tree: Any, wanted: Wanted | None = None, *, reports: bool = True) -> None:
    """Before a process works on a workload: its workload folder, and its report folder unless
    not ``reports``, brought up to what object storage holds (nothing for a folder on this
    machine). ``wanted``: only these sets of the workload (:data:`Wanted`; None: every one).
    ``layout``: a :class:`~pipeline.layout.WorkloadLayout`; ``tree``: a
    :class:`~pipeline.ledger.ReportTree`."""
    if layout.remote is not None and wanted != {}:
        pull_workload(layout.remote, wanted)
    if reports and tree.remote is not None:
        pull_reports(tree.remote)
