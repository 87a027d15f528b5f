"""Passes over a workload published from days, kept at the end of the last day and carried on
from there (:class:`DayPasses`): the streamed cache replays' (:mod:`pipeline.sim.resume`) and
the prefix stage's (:mod:`pipeline.prefix.days`).

A pass that carries state from request to request (a cache's blocks, a conversation) cannot
be cut by day; what can be kept is where it stood after the last day it read. It is kept with
the days it covers, each with the digest of the set the union held of it
(:func:`pipeline.ingest.days.united_days`), under a key of what else it was made of. The next
time it runs, if the union still starts with exactly those days and the key is the same, the
pass is read back and fed only the parts of the days after them, so its results are those of
one pass over every day. Otherwise (a day it covers changed, another key, missing or damaged
files) every day is read again and the pass kept again. Each time, one line says which.

The pass is kept with :mod:`pickle` (numpy arrays, polars frames, generators' states),
compressed with zstd, with its key and days inside, keyed by the digest of the ``pipeline``
package's source and by the numpy, polars and Python versions, and checked against the SHA-256
its ``resume.json`` records as it is read. A pass may keep files of its own beside its state
(named in ``resume.json``). It is only ever read from the workload's own folder (or its
bucket), which enginefit writes. On object storage the pass is uploaded (its files and
``state.pickle``, then ``resume.json``, which commits it) so another machine resumes from it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import pickle
import platform
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO, Protocol, Self, TypeVar, cast

import numpy as np
import polars as pl
from zstandard import ZstdCompressor, ZstdDecompressor

from pipeline.digests import sha256_of
from pipeline.errors import EnginefitError
from pipeline.ingest.days import UnitedDay, united_days
from pipeline.layout import WorkloadLayout
from pipeline.mirror import files_below, push_committed
from pipeline.remote import Mirror, StorageError
from pipeline.store import atomic_path, scan_requests, write_bytes_atomic

RESUME_VERSION = 2
STATE = "state.pickle"
MARKER = "resume.json"
# The package whose source a kept pass depends on: all of it, not only the modules its objects
# come from (how a chunk is read, conformed and timed reaches the state too), so a pass kept
# by another version of enginefit is never read (an upgrade replays the quarter once).
_PACKAGE = Path(__file__).resolve().parent

# The request table in arrival order, as a fresh iterator of chunks each time it is called
# (each a lazy frame: only the columns a pass reads are loaded).
RequestChunks = Callable[[], Iterable[pl.LazyFrame]]


def part_chunks(parts: Sequence[Path]) -> RequestChunks:
    """The canonical table's part files (in arrival order) as chunks, one part each."""
    return lambda: (scan_requests(part) for part in parts)


class Feedable(Protocol):
    """A pass over the table that can be kept between days: fed the next chunks. A pass that
    writes files of its own beside its state (the prefix stage's sessions of each part) names
    them, relative to its folder, in a ``kept_files`` attribute, and those written by this
    process in ``fresh_files``: they are uploaded and fetched with the state."""

    @property
    def requests(self) -> int: ...

    def feed(self, chunks: RequestChunks) -> None: ...


Pass = TypeVar("Pass", bound=Feedable)


@functools.cache
def code_digest() -> str:
    """SHA-256 of the source of every module of the ``pipeline`` package (read once a
    process: every replay it keeps or reads back is keyed by the code it runs)."""
    digest = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        digest.update(path.relative_to(_PACKAGE).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class DayPasses:
    """A workload published from days, as a pass kept between runs reads it: its days (each
    with its parts, in order) and the folder its passes are kept in, one folder a pass
    (``remote``: that folder's mirror on object storage). ``said`` collects one line a pass on
    what was carried on; ``used`` names the passes kept by this process, ``forgotten`` those it
    removed."""

    days: tuple[UnitedDay, ...]
    parts: tuple[Path, ...]
    folder: Path
    remote: Mirror | None = None
    keeps: bool = True  # False: passes read back, never kept nor removed (a what-if)
    said: list[str] = field(default_factory=list, compare=False)
    used: set[str] = field(default_factory=set, compare=False)
    forgotten: list[str] = field(default_factory=list, compare=False)

    @classmethod
    def of(cls, layout: WorkloadLayout, folder: Path, *, keeps: bool = True) -> Self | None:
        """The union's days, its passes kept in ``folder`` (in ``layout``), when the workload
        is a union of days that records their parts and those add up to the table's parts
        (else None: read whole)."""
        days = united_days(layout)
        parts = layout.ingest.parts()
        if days is None or sum(d.parts for d in days) != len(parts):
            return None
        return cls(tuple(days), tuple(parts), folder, layout.remote, keeps)

    def carried(
        self,
        name: str,
        label: str,
        made_of: dict[str, Any],
        about: dict[str, Any],
        kind: type[Pass],
        start: Callable[[Path], Pass],
        placed: Callable[[Pass, Path], None] | None = None,
    ) -> Pass:
        """A pass over the table fed every day: the pass kept as ``name`` read back when it
        covers the first days of the table and was ``made_of`` the same inputs (then only the
        later days' parts are read), else ``start(folder)`` fed every day; kept again at the
        end of the last day. One line (``label``: what it is) says which, with how the kept
        pass's ``about`` (the inputs worth naming, e.g. a sample rate) differs when that is
        why. ``folder`` is the pass's own (where files it keeps are written); ``placed`` tells
        a pass read back where that is now (the workload folder may have moved)."""
        kept = KeptPass(self.folder / name, self.remote)
        key = self._key(made_of)
        resumed, why = kept.read_back(key, self.days, kind, about)
        if resumed is None:
            streamed, done = start(kept.folder), 0
        else:
            streamed, done = resumed
            if placed is not None:
                placed(streamed, kept.folder)
        streamed.feed(part_chunks(self.parts[sum(d.parts for d in self.days[:done]) :]))
        self.used.add(name)
        last = self.days[-1].day if self.days else "none"
        if not self.keeps:
            ending = "not kept (read only)"
        elif done == len(self.days):
            ending = f"the pass at the end of {last} unchanged in {kept.folder}"
        else:
            try:
                size = kept.keep(streamed, key, self.days, about)
            except (OSError, EnginefitError) as exc:  # the replay's results stand without it
                ending = f"the pass was not kept ({exc}): the next run replays every day"
            else:
                ending = f"the pass at the end of {last} kept in {kept.folder}"
                ending += f" ({size / 2**20:,.1f} MiB)"
        read = f"{done} of {len(self.days)} days read back" if done else why
        self.said.append(f"{label}: {len(self.days) - done} day(s) replayed ({read}); {ending}")
        return streamed

    def _key(self, made_of: dict[str, Any]) -> str:
        """What a kept pass means beyond its days: the pass's inputs other than the table
        (``made_of``), the code that made it and the versions its pickle depends on."""
        whole = {
            "version": RESUME_VERSION,
            "code": code_digest(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "polars": pl.__version__,
            **made_of,
        }
        text = json.dumps(whole, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()


def forget_kept(folder: Path, remote: Mirror | None) -> bool:
    """The pass kept in ``folder`` removed, here and in the bucket (its marker first): a
    replay that no longer resumes by days (the table went back under the streaming limit,
    or is no longer a union of days). Whether this machine held one."""
    held = (folder / MARKER).is_file() or (folder / STATE).is_file()
    if held or remote is not None:
        KeptPass(folder, remote).forget()
    return held


# A file a kept pass may name beside its state: a folder and a file name of its own, never a
# path out of the pass's folder.
_OWN_FILE = re.compile(r"^[a-z]+/[0-9a-f-]+\.parquet$")


def _own_files(marker: Any) -> list[str]:
    """The files of its own a kept pass's marker names (ValueError: one out of its folder)."""
    files = [str(f) for f in marker.get("files", [])]
    if not all(_OWN_FILE.match(f) for f in files):
        raise ValueError("a file out of the pass's folder")
    return files


@dataclass(frozen=True)
class KeptPass:
    """One replay's kept pass: ``state.pickle`` and ``resume.json`` in ``folder`` (and in the
    bucket, when ``remote`` mirrors it)."""

    folder: Path
    remote: Mirror | None

    @property
    def _relative(self) -> str:
        assert self.remote is not None
        return self.folder.relative_to(self.remote.local).as_posix()

    def read_back(
        self, key: str, days: tuple[UnitedDay, ...], kind: type[Pass], about: dict[str, Any]
    ) -> tuple[tuple[Pass, int] | None, str]:
        """The kept pass (a ``kind``) and how many of ``days`` (the table's, in order) it
        covers, or None and why not (the whole table is replayed)."""
        unfetched = self._fetch()
        if unfetched is not None:
            return None, unfetched
        marker = self.folder / MARKER
        if not marker.is_file():
            return None, "no pass kept yet"
        try:
            kept = json.loads(marker.read_bytes())
            covered = [UnitedDay(d["day"], d["digest"], int(d["parts"])) for d in kept["days"]]
            state_sha = str(kept["state_sha256"])
            kept_key = str(kept["key"])
            kept_about = dict(kept.get("about", {}))
            files = _own_files(kept)
        except (OSError, ValueError, TypeError, KeyError):
            return None, f"{marker} is damaged"
        if kept_key != key:
            differs = [
                f"{name} {kept_about.get(name)}, now {value}"
                for name, value in about.items()
                if kept_about.get(name) != value
            ]
            return None, "the kept pass was made with " + (
                "; ".join(differs) if differs else "other settings or code"
            )
        if tuple(covered) != days[: len(covered)]:
            changed = next((c.day for c, d in zip(covered, days, strict=False) if c != d), None)
            if changed is None:  # the table ends before the kept pass does
                return None, f"day {covered[len(days)].day}, which the kept pass covers, is gone"
            return None, f"day {changed}, which the kept pass covers, changed"
        missing = next((f for f in files if not (self.folder / f).is_file()), None)
        if missing is not None:
            return None, f"{self.folder / missing}, which the kept pass names, is missing"
        state = self.folder / STATE
        try:
            with state.open("rb") as handle:
                if sha256_of(handle) != state_sha:
                    return None, f"{state} does not match {marker}"
                handle.seek(0)
                # written by keep and its digest checked, read from the same handle: the
                # workload folder's own file; whatever it holds, a wrong one replays whole
                with ZstdDecompressor().stream_reader(handle, closefd=False) as raw:
                    inside = pickle.load(raw)
        except FileNotFoundError:
            return None, f"{state} is missing"
        except Exception as exc:  # noqa: BLE001 -- any failure to read it back replays whole
            return None, f"{state} cannot be read back ({type(exc).__name__})"
        if (
            not isinstance(inside, tuple)
            or len(inside) != 3
            or inside[:2] != (key, tuple(covered))
            or not isinstance(inside[2], kind)
        ):
            return None, f"{state} is not the pass {marker} names (another run replaced it)"
        return (inside[2], len(covered)), ""

    def keep(
        self, streamed: Feedable, key: str, days: tuple[UnitedDay, ...], about: dict[str, Any]
    ) -> int:
        """Keep ``streamed`` (at the end of the last of ``days``) with the days it covers:
        ``state.pickle`` first, then ``resume.json`` naming its digest, which commits it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / MARKER).unlink(missing_ok=True)  # the old state is replaced below
        state = self.folder / STATE
        with atomic_path(state) as tmp, tmp.open("wb") as handle:
            # written as pickled, not held whole: the state is the size of the caches' blocks,
            # mostly room to spare (zstd's fastest level: 570 MiB to 92 MiB in 0.6 s)
            writer = _Hashing(handle)
            with ZstdCompressor(level=1).stream_writer(
                cast(IO[bytes], writer), closefd=False
            ) as packed:
                # the key and days inside too: the marker only commits, the state says what
                # it is (a concurrent run's state renamed over this one is then refused)
                pickle.dump((key, days, streamed), packed, protocol=pickle.HIGHEST_PROTOCOL)
        files = [str(f) for f in getattr(streamed, "kept_files", ())]
        marker = json.dumps(
            {
                "version": RESUME_VERSION,
                "key": key,
                "days": [dataclasses.asdict(d) for d in days],
                "requests": streamed.requests,
                "about": about,
                "state_sha256": writer.digest.hexdigest(),
                "files": files,
            },
            indent=1,
            sort_keys=True,
        ).encode()
        if self.remote is not None:
            # the pass's own files written by this process (the others are there already)
            fresh = [self.folder / f for f in getattr(streamed, "fresh_files", ())]
            push_committed(self.remote, [*fresh, state], self.folder / MARKER, marker)
        write_bytes_atomic(self.folder / MARKER, marker)
        return writer.size

    def forget(self) -> None:
        """Removed, its marker first, then its state and the files it names; in the bucket,
        its marker first, then its state and every file of its own there (whichever machine
        kept them)."""
        if self.remote is not None:
            below = files_below(self.folder, self.remote)
            if MARKER in below:
                self.remote.remote.delete(below[MARKER])
            for name, key in sorted(below.items()):
                if name == STATE or _OWN_FILE.match(name):
                    self.remote.remote.delete(key)
        (self.folder / MARKER).unlink(missing_ok=True)
        below_here = self.folder.rglob("*") if self.folder.is_dir() else iter(())
        for path in sorted(below_here, reverse=True):  # a folder's files before the folder
            name = path.relative_to(self.folder).as_posix()
            if path.is_dir():
                with contextlib.suppress(OSError):
                    path.rmdir()  # only when empty: nothing else is removed
            elif name == STATE or _OWN_FILE.match(name):
                path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.folder.rmdir()

    def _fetch(self) -> str | None:
        """The bucket's kept pass, when it holds one this machine lacks (another machine's);
        why it could not be fetched (None: fetched, or nothing to fetch)."""
        if self.remote is None:
            return None
        local = self.folder / MARKER
        try:
            remote_marker = self.remote.remote.get(f"{self._relative}/{MARKER}")
            if remote_marker is None:
                return None
            same = local.is_file() and local.read_bytes() == remote_marker
            if not same:
                self.folder.mkdir(parents=True, exist_ok=True)
                local.unlink(missing_ok=True)
                self.remote.remote.download(f"{self._relative}/{STATE}", self.folder / STATE)
            # its own files this machine lacks (all of them, or one removed here since)
            for name in _own_files(json.loads(remote_marker)):
                if not (self.folder / name).is_file():
                    (self.folder / name).parent.mkdir(parents=True, exist_ok=True)
                    self.remote.remote.download(f"{self._relative}/{name}", self.folder / name)
        except FileNotFoundError:  # replaced meanwhile: replayed whole
            return "the bucket's pass was replaced while it was fetched"
        except StorageError as exc:  # the replay does not need it: replayed whole
            return f"the bucket's pass could not be fetched ({exc})"
        except (ValueError, AttributeError):  # a damaged marker: replayed whole
            return "the bucket's pass names no files it can fetch"
        if not same:
            write_bytes_atomic(local, remote_marker)
        return None


class _Hashing:
    """A binary file that hashes and counts what is written to it (the pickle's digest without
    reading the file back)."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.digest.update(view)
        self.size += view.nbytes
        return self.handle.write(view)
