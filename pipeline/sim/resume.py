"""The scenarios' streamed pass over a workload published from days, resumed where it ended.

Streaming the scenarios (:mod:`pipeline.sim.stream`) carries every cache's state through the
quarter in time order, so a day cannot be replayed on its own. What can be kept is where the
pass stood: after the last day it read, the pass (:class:`~pipeline.sim.stream.StreamPass`:
the slot tables, the replicas' queues, the requests still running, the routers' counters and
random generator, the session inference, the sums) is kept under ``simulation/resume/`` with
the days it covers, each with the digest of the set the union held of it
(:func:`pipeline.ingest.days.united_days`). The next time the scenarios run, if the union still
starts with exactly those days, the pass is read back and fed only the parts of the days after
them; its summaries are those of one pass over every day (``tests/test_sim_resume.py``). So a
day appended to the quarter replays that day, not the quarter.

It is not resumed, and the whole table is replayed (and the pass kept again), when a day it
covers was ingested again, removed or put before its last one; when the scenarios, the
replay's settings, the latency model or the code of the replay changed; when the whole table's
facts changed (its block size, or a request without a logged session where there was none);
or when the kept files are missing or damaged. Each time, one line says which.

The pass is kept with :mod:`pickle` (its state is numpy arrays, polars frames and the
generator's state), keyed by the digest of the modules that define it and by the numpy, polars
and Python versions, and checked against the SHA-256 its ``resume.json`` records before it is
read. It is only ever read from the workload's own folder (or its bucket), which enginefit
writes. On object storage the pass is uploaded (``state.pickle``, then ``resume.json``, which
commits it) so another machine resumes from it.

Disk: the kept pass is about the size of the scenarios' block state (at 100M requests over a
quarter with the default grid, the step's process holds 1.5 GiB); one pass is kept, replaced
each time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
import platform
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO

import numpy as np
import polars as pl

from pipeline import arrays
from pipeline.ingest.days import UnitedDay, united_days
from pipeline.layout import WorkloadLayout
from pipeline.prefix import cache_rules, hashmap, sessions
from pipeline.remote import Mirror
from pipeline.sim import blocks, kernels, replay, slots, stream
from pipeline.sim import config as sim_config
from pipeline.sim.config import Scenario, SimConfig
from pipeline.sim.stream import (
    RequestStream,
    StreamedRun,
    StreamPass,
    TableFacts,
    part_chunks,
    routes_by_session,
)
from pipeline.store import atomic_path, sha256_file, write_bytes_atomic

RESUME_VERSION = 1
STATE = "state.pickle"
MARKER = "resume.json"
# The modules whose objects the kept pass is made of, or whose rules its state follows.
_CODE: tuple[ModuleType, ...] = (
    arrays,
    blocks,
    cache_rules,
    hashmap,
    kernels,
    replay,
    sessions,
    sim_config,
    slots,
    stream,
)
# Settings that the scenarios' replay does not read (the curves').
_NOT_REPLAYED = frozenset({"curve_exact_max_blocks", "curve_sample_rate"})


def code_digest() -> str:
    """SHA-256 of the source of the modules a kept pass depends on (:data:`_CODE`)."""
    digest = hashlib.sha256()
    for module in sorted(_CODE, key=lambda m: m.__name__):
        digest.update(module.__name__.encode())
        digest.update(Path(str(module.__file__)).read_bytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class DailyStream:
    """A workload published from days, as the scenarios stream it: the table's stream, its
    days (each with its parts, in order) and the folder the pass is kept in (``remote``: that
    folder's mirror on object storage). ``said`` collects one line a run on what was resumed."""

    stream: RequestStream
    days: tuple[UnitedDay, ...]
    parts: tuple[Path, ...]
    folder: Path
    remote: Mirror | None = None
    said: list[str] = field(default_factory=list, compare=False)

    @classmethod
    def of(cls, layout: WorkloadLayout, stream: RequestStream) -> DailyStream | None:
        """``stream`` with the union's days, when the workload is a union of days that records
        their parts and those add up to the table's parts (else None: streamed whole)."""
        days = united_days(layout)
        parts = layout.ingest.parts()
        if days is None or sum(d.parts for d in days) != len(parts):
            return None
        return cls(
            stream, tuple(days), tuple(parts), layout.simulation.dir / "resume", layout.remote
        )

    def simulate_many(self, scenarios: list[Scenario], settings: SimConfig) -> list[StreamedRun]:
        """:meth:`RequestStream.simulate_many`, from the kept pass when it covers the first
        days of the table (then only the later days' parts are read), the pass kept again at
        the end of the last day."""
        chunks = self.stream.chunks
        facts = TableFacts.of(chunks, any(routes_by_session(s.routing) for s in scenarios))
        key = self._key(scenarios, settings, facts)
        resumed, why = self._read_back(key)
        if resumed is None:
            streamed, done = self._new_pass(scenarios, settings, facts), 0
        else:
            streamed, done = resumed
        streamed.feed(part_chunks(self.parts[sum(d.parts for d in self.days[:done]) :]))
        size = self._keep(streamed, key)
        runs = streamed.finish()
        last = self.days[-1].day if self.days else "none"
        read = f"{done} of {len(self.days)} days read back" if done else why
        self.said.append(
            f"scenario replay: {len(self.days) - done} day(s) replayed ({read}); the pass at "
            f"the end of {last} kept in {self.folder} ({size / 2**20:,.1f} MiB)"
        )
        return runs

    def _new_pass(
        self, scenarios: list[Scenario], settings: SimConfig, facts: TableFacts
    ) -> StreamPass:
        s = self.stream
        return StreamPass(
            scenarios, settings, facts, latency_model=s.latency_model, max_rows=s.max_rows
        )

    def _key(self, scenarios: list[Scenario], settings: SimConfig, facts: TableFacts) -> str:
        """What the kept pass means beyond its days: the replay's inputs other than the
        table, the code that made it and the versions its pickle depends on."""
        replayed = settings.model_dump(mode="json", exclude=set(_NOT_REPLAYED))
        made_of = {
            "version": RESUME_VERSION,
            "code": code_digest(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "polars": pl.__version__,
            "scenarios": [dataclasses.asdict(s) for s in scenarios],
            "settings": replayed,
            "latency_model": dataclasses.asdict(self.stream.latency_model),
            "max_rows": self.stream.max_rows,
            "facts": dataclasses.asdict(facts),
        }
        text = json.dumps(made_of, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def _read_back(self, key: str) -> tuple[tuple[StreamPass, int] | None, str]:
        """The kept pass and how many of the table's first days it covers, or None and why
        not (the whole table is replayed)."""
        self._fetch()
        marker = self.folder / MARKER
        if not marker.is_file():
            return None, "no pass kept yet"
        try:
            kept = json.loads(marker.read_bytes())
            covered = [UnitedDay(d["day"], d["digest"], int(d["parts"])) for d in kept["days"]]
            state_sha = str(kept["state_sha256"])
            kept_key = str(kept["key"])
        except (OSError, ValueError, TypeError, KeyError):
            return None, f"{marker} is damaged"
        if kept_key != key:
            return None, "the kept pass was made with other scenarios, settings or code"
        if tuple(covered) != self.days[: len(covered)]:
            changed = next(
                (c.day for c, d in zip(covered, self.days, strict=False) if c != d),
                covered[len(self.days)].day if len(covered) > len(self.days) else "?",
            )
            return None, f"day {changed}, which the kept pass covers, changed"
        state = self.folder / STATE
        try:
            if sha256_file(state) != state_sha:
                return None, f"{state} does not match {marker}"
            # written by _keep and its digest checked: the workload folder's own file
            with state.open("rb") as handle:
                streamed = pickle.load(handle)
        except OSError:
            return None, f"{state} is missing"
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError):
            return None, f"{state} cannot be read back"
        if not isinstance(streamed, StreamPass):
            return None, f"{state} is not a kept pass"
        return (streamed, len(covered)), ""

    def _keep(self, streamed: StreamPass, key: str) -> int:
        """Keep ``streamed`` (at the end of the table's last day) with the days it covers:
        ``state.pickle`` first, then ``resume.json`` naming its digest, which commits it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / MARKER).unlink(missing_ok=True)  # the old state is replaced below
        state = self.folder / STATE
        with atomic_path(state) as tmp, tmp.open("wb") as handle:
            # written as pickled, not held whole: the state is the size of the caches' blocks
            writer = _Hashing(handle)
            pickle.dump(streamed, writer, protocol=pickle.HIGHEST_PROTOCOL)
        marker = json.dumps(
            {
                "version": RESUME_VERSION,
                "key": key,
                "days": [dataclasses.asdict(d) for d in self.days],
                "requests": streamed.totals.requests,
                "state_sha256": writer.digest.hexdigest(),
            },
            indent=1,
            sort_keys=True,
        ).encode()
        if self.remote is not None:
            relative = self.folder.relative_to(self.remote.local).as_posix()
            self.remote.remote.put(f"{relative}/{STATE}", self.folder / STATE)
            self.remote.remote.put(f"{relative}/{MARKER}", marker)
        write_bytes_atomic(self.folder / MARKER, marker)
        return writer.size

    def _fetch(self) -> None:
        """The bucket's kept pass, when it holds one this machine lacks (another machine's)."""
        if self.remote is None:
            return
        relative = self.folder.relative_to(self.remote.local).as_posix()
        remote_marker = self.remote.remote.get(f"{relative}/{MARKER}")
        local = self.folder / MARKER
        if remote_marker is None or (local.is_file() and local.read_bytes() == remote_marker):
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            local.unlink(missing_ok=True)
            self.remote.remote.download(f"{relative}/{STATE}", self.folder / STATE)
        except FileNotFoundError:  # replaced meanwhile: replayed whole
            return
        write_bytes_atomic(local, remote_marker)


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
