"""The streamed replays of a workload published from days, resumed where they ended.

Streaming a replay (:mod:`pipeline.sim.stream`) carries every cache's state through the quarter
in time order, so a day cannot be replayed on its own. What can be kept is where the pass
stood: after the last day it read, the pass (:class:`~pipeline.sim.stream.StreamPass`: the
slot tables, the replicas' queues, the requests still running, the routers' counters and random
generator, the session inference, the sums, and each request's hit tokens when they are asked
for) is kept with the days it covers, each with the digest of the set the union held of it
(:func:`pipeline.ingest.days.united_days`): the scenario grid's under ``simulation/resume/``,
each of the capacity stage's fleet replays under ``capacity/resume/``. The sampled capacity
curves' gathering (:class:`~pipeline.sim.curve_stream.CurveGathering`: the SHARDS sample and
the curves' routers) is kept the same way, under ``simulation/resume/curves/``, while its rate
stays put (a power of two: until the table doubles). The next time it runs, if the union still
starts with exactly those days, the pass is read back and fed only the parts of the days after
them; its summaries are those of one pass over every day (``tests/test_sim_resume.py``). So a
day appended to the quarter replays that day, not the quarter.

It is not resumed, and the whole table is replayed (and the pass kept again), when a day it
covers was ingested again, removed or put before its last one; when the scenarios, the
replay's settings, the latency model or enginefit's code changed; when the whole table's facts
changed (its block size, or a request without a logged session where there was none); or when
the kept files are missing, damaged or another run's. Each time, one line says which. A pass
that cannot be kept (a full disk, a bucket that refuses it) is said too, and the replay's
results stand.

The pass is kept with :mod:`pickle` (its state is numpy arrays, polars frames and the
generator's state), compressed with zstd, with its key and days inside, keyed by the digest of
the ``pipeline`` package's source and by the numpy, polars and Python versions, and checked
against the SHA-256 its ``resume.json`` records as it is read. It is only ever read from the
workload's own folder (or its bucket), which enginefit writes. On object storage the pass is
uploaded (``state.pickle``, then ``resume.json``, which commits it) so another machine resumes
from it.

Disk: a kept pass is about the size of its caches' block state (139.5 MiB for the default grid
over a generated 10M-request quarter), plus 8 bytes a request before compression for a fleet
replay's hit tokens; one pass a replay, replaced each time a day is added.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO, Protocol, TypeVar, cast

import numpy as np
import polars as pl
from zstandard import ZstdCompressor, ZstdDecompressor

from pipeline.digests import sha256_of
from pipeline.errors import EnginefitError
from pipeline.ingest.days import UnitedDay, united_days
from pipeline.layout import WorkloadLayout
from pipeline.mirror import folders_below, push_committed
from pipeline.present.text import sample_rate as sample_rate_text
from pipeline.remote import Mirror, StorageError
from pipeline.sim.config import Scenario, SimConfig
from pipeline.sim.curve import Curve
from pipeline.sim.curve_stream import Combination, CurveGathering, gathering_facts
from pipeline.sim.stream import (
    RequestChunks,
    RequestStream,
    StreamedRun,
    StreamPass,
    TableFacts,
    part_chunks,
    routes_by_session,
)
from pipeline.store import atomic_path, write_bytes_atomic

RESUME_VERSION = 2
STATE = "state.pickle"
MARKER = "resume.json"
# The package whose source a kept pass depends on: all of it, not only the modules its objects
# come from (how a chunk is read, conformed and timed reaches the state too), so a pass kept
# by another version of enginefit is never read (an upgrade replays the quarter once).
_PACKAGE = Path(__file__).resolve().parents[1]
# Settings that a replay does not read: the curves', and the grid (the replay's scenarios are
# in the key themselves, so a fleet replay's pass outlives a change to the grid).
_NOT_REPLAYED = frozenset(
    {
        "curve_exact_max_blocks",
        "curve_sample_rate",
        "block_sizes",
        "replicas",
        "cache_tokens",
        "routings",
        "compare_isolation",
    }
)


class Feedable(Protocol):
    """A pass over the table that can be kept between days: fed the next chunks."""

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
class DailyStream:
    """A workload published from days, as a streamed replay reads it: the table's stream, its
    days (each with its parts, in order) and the folder its passes are kept in, one folder a
    replay (``remote``: that folder's mirror on object storage). ``said`` collects one line a
    replay on what was resumed; ``used`` names the passes kept by this process, ``forgotten``
    those it removed (:meth:`forget_unused`)."""

    stream: RequestStream
    days: tuple[UnitedDay, ...]
    parts: tuple[Path, ...]
    folder: Path
    remote: Mirror | None = None
    keeps: bool = True  # False: passes read back, never kept nor removed (a what-if)
    said: list[str] = field(default_factory=list, compare=False)
    used: set[str] = field(default_factory=set, compare=False)
    forgotten: list[str] = field(default_factory=list, compare=False)

    @classmethod
    def of(
        cls, layout: WorkloadLayout, stream: RequestStream, folder: Path, *, keeps: bool = True
    ) -> DailyStream | None:
        """``stream`` with the union's days, its passes kept in ``folder`` (in ``layout``),
        when the workload is a union of days that records their parts and those add up to the
        table's parts (else None: streamed whole)."""
        days = united_days(layout)
        parts = layout.ingest.parts()
        if days is None or sum(d.parts for d in days) != len(parts):
            return None
        return cls(stream, tuple(days), tuple(parts), folder, layout.remote, keeps)

    def simulate_many(self, scenarios: list[Scenario], settings: SimConfig) -> list[StreamedRun]:
        """:meth:`RequestStream.simulate_many`, resumed (:meth:`_resumed`) as ``scenarios``."""
        return self._resumed(SCENARIOS, scenarios, settings, with_instant=True, per_request=False)

    def simulate(
        self,
        scenario: Scenario,
        settings: SimConfig,
        *,
        with_instant: bool = True,
        per_request: bool = False,
    ) -> StreamedRun:
        """:meth:`RequestStream.simulate`, resumed (:meth:`_resumed`) under the scenario's key
        (every request's hit tokens, ``per_request``, kept with the pass)."""
        name = (
            scenario.key + ("" if with_instant else _ALONE) + (_PER_REQUEST if per_request else "")
        )
        (run,) = self._resumed(
            name, [scenario], settings, with_instant=with_instant, per_request=per_request
        )
        return run

    def _resumed(
        self,
        name: str,
        scenarios: list[Scenario],
        settings: SimConfig,
        *,
        with_instant: bool,
        per_request: bool,
    ) -> list[StreamedRun]:
        """The runs of one pass over the table (:meth:`carried` as ``name``)."""
        facts = TableFacts.of(
            self.stream.chunks, any(routes_by_session(s.routing) for s in scenarios), self.parts
        )
        replayed = settings.model_dump(mode="json", exclude=set(_NOT_REPLAYED))
        made_of = {
            "scenarios": [dataclasses.asdict(s) for s in scenarios],
            "settings": replayed,
            "facts": dataclasses.asdict(facts),
            "with_instant": with_instant,
            "per_request": per_request,
        }
        s = self.stream
        streamed = self.carried(
            name,
            "scenario replay" if name == SCENARIOS else f"replay {name}",
            made_of,
            _facts_named(facts),
            StreamPass,
            lambda: StreamPass(
                scenarios,
                settings,
                facts,
                latency_model=s.latency_model,
                max_rows=s.max_rows,
                with_instant=with_instant,
                per_request=per_request,
            ),
        )
        return streamed.finish()

    def gathered_curves(
        self, settings: SimConfig, combinations: list[Combination], rate: float
    ) -> list[Curve]:
        """:func:`pipeline.sim.curve_stream.streamed_curves` of every day, its gathering
        (:class:`CurveGathering`) carried on from the days read before (:meth:`carried` as
        ``curves``) while the rate stays put (it halves each time the table doubles,
        :func:`pipeline.sim.curve_stream.sample_rate`)."""
        chunks = self.stream.chunks
        facts = gathering_facts(chunks, combinations, self.parts)
        # every setting but those the gathering does not read (its rate is named instead)
        read = settings.model_dump(mode="json", exclude=set(_NOT_GATHERED))
        made_of = {
            "pass": CURVES,
            "combinations": combinations,
            "rate": rate,
            "settings": read,
            "facts": dataclasses.asdict(facts),
        }
        latency = self.stream.latency_model
        gathering = self.carried(
            CURVES,
            "sampled curves",
            made_of,
            {"sample rate": sample_rate_text(rate), **_facts_named(facts)},
            CurveGathering,
            lambda: CurveGathering(settings, combinations, rate, facts, latency),
        )
        return gathering.finish()

    def carried(
        self,
        name: str,
        label: str,
        made_of: dict[str, Any],
        about: dict[str, Any],
        kind: type[Pass],
        start: Callable[[], Pass],
    ) -> Pass:
        """A pass over the table fed every day: the pass kept as ``name`` read back when it
        covers the first days of the table and was ``made_of`` the same inputs (then only the
        later days' parts are read), else ``start()`` fed every day; kept again at the end of
        the last day. One line (``label``: what it is) says which, with how the kept pass's
        ``about`` (the inputs worth naming, e.g. a sample rate) differs when that is why."""
        kept = _KeptPass(self.folder / name, self.remote)
        key = self._key(made_of)
        resumed, why = kept.read_back(key, self.days, kind, about)
        if resumed is None:
            streamed, done = start(), 0
        else:
            streamed, done = resumed
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

    def forget_unused(self) -> None:
        """Remove the kept passes of replays this process did not make (a fleet replay the
        capacity stage no longer asks for), here and in the bucket (named in ``forgotten``)."""
        if not self.keeps:
            return
        names = folders_below(self.folder, self.remote)
        gone = sorted(n for n in names if _PASS_NAME.match(n) and n not in self.used)
        for name in gone:
            _KeptPass(self.folder / name, self.remote).forget()
        self.forgotten.extend(gone)

    def _key(self, made_of: dict[str, Any]) -> str:
        """What a kept pass means beyond its days: the pass's inputs other than the table
        (``made_of``), the code that made it and the versions its pickle depends on."""
        whole = {
            "version": RESUME_VERSION,
            "code": code_digest(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "polars": pl.__version__,
            "latency_model": dataclasses.asdict(self.stream.latency_model),
            "max_rows": self.stream.max_rows,
            **made_of,
        }
        text = json.dumps(whole, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()


def _facts_named(facts: TableFacts) -> dict[str, Any]:
    """The whole table's facts a kept pass depends on, as its line names them when they
    changed (a new day with another block size, or the first request without a session)."""
    return {"block size": facts.block_size, "sessions inferred": facts.infer_sessions}


# Settings the curves' gathering does not read: the rate's own (the rate is in the key) and the
# scenarios' replay (cache sizes, isolation compared, the cache-aware router, lifetimes, slots,
# the request timeout); its routers read the seed and the affinity margin, its keys isolation.
_NOT_GATHERED = frozenset(
    {
        "curve_exact_max_blocks",
        "curve_sample_rate",
        "cache_tokens",
        "compare_isolation",
        "cache_aware",
        "request_lifetime",
        "replica_slots",
        "request_timeout_s",
    }
)


def forget_kept(folder: Path, remote: Mirror | None) -> bool:
    """The pass kept in ``folder`` removed, here and in the bucket (its marker first): a
    replay that no longer resumes by days (the table went back under the streaming limit,
    or is no longer a union of days). Whether this machine held one."""
    held = (folder / MARKER).is_file() or (folder / STATE).is_file()
    if held or remote is not None:
        _KeptPass(folder, remote).forget()
    return held


# The kept passes' folder names: the curves' gathering, the scenario grid's, and one scenario's
# (its key, with or without the instant replay beside it, with or without every request's hit
# tokens).
CURVES = "curves"
SCENARIOS = "scenarios"
_ALONE = "-alone"
_PER_REQUEST = "-per-request"
_PASS_NAME = re.compile(r"^(scenarios|b\d+_r\d+_c\d+_[a-z_]+(-alone)?(-per-request)?)$")


@dataclass(frozen=True)
class _KeptPass:
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
            changed = next(
                (c.day for c, d in zip(covered, days, strict=False) if c != d),
                covered[len(days)].day if len(covered) > len(days) else "?",
            )
            return None, f"day {changed}, which the kept pass covers, changed"
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
        marker = json.dumps(
            {
                "version": RESUME_VERSION,
                "key": key,
                "days": [dataclasses.asdict(d) for d in days],
                "requests": streamed.requests,
                "about": about,
                "state_sha256": writer.digest.hexdigest(),
            },
            indent=1,
            sort_keys=True,
        ).encode()
        if self.remote is not None:
            push_committed(self.remote, [state], self.folder / MARKER, marker)
        write_bytes_atomic(self.folder / MARKER, marker)
        return writer.size

    def forget(self) -> None:
        """Removed, its marker first (in the bucket too)."""
        if self.remote is not None:
            for name in (MARKER, STATE):
                self.remote.remote.delete(f"{self._relative}/{name}")
        for name in (MARKER, STATE):
            (self.folder / name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.folder.rmdir()  # only when empty: nothing else is removed

    def _fetch(self) -> str | None:
        """The bucket's kept pass, when it holds one this machine lacks (another machine's);
        why it could not be fetched (None: fetched, or nothing to fetch)."""
        if self.remote is None:
            return None
        local = self.folder / MARKER
        try:
            remote_marker = self.remote.remote.get(f"{self._relative}/{MARKER}")
            if remote_marker is None or (local.is_file() and local.read_bytes() == remote_marker):
                return None
            self.folder.mkdir(parents=True, exist_ok=True)
            local.unlink(missing_ok=True)
            self.remote.remote.download(f"{self._relative}/{STATE}", self.folder / STATE)
        except FileNotFoundError:  # replaced meanwhile: replayed whole
            return "the bucket's pass was replaced while it was fetched"
        except StorageError as exc:  # the replay does not need it: replayed whole
            return f"the bucket's pass could not be fetched ({exc})"
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
