"""``enginefit report``'s (and ``decide``'s) progress: one line on standard error per finished
step (asset, check or scenario), with its duration, and one while a step runs longer than a few
seconds (the first ingest, the first scenario compiling its kernels, the PDF), read from the
run's event log while the run goes on.

The lines come from the instance's event log, not from a logger in the step's process: with the
multiprocess executor (or a cluster executor) steps run in other processes, whose output is
theirs; the event log is where every executor records every step. The steps' own console
logging is turned down (:data:`QUIET_LOGGERS`), and the run history keeps every event.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

import dagster as dg

# Run config: Dagster's console logger only for errors a person must see; the step lines below
# replace its event-by-event log.
QUIET_LOGGERS = {"console": {"config": {"log_level": "CRITICAL"}}}

_WATCHED = {
    dg.DagsterEventType.STEP_START,
    dg.DagsterEventType.STEP_SUCCESS,
    dg.DagsterEventType.STEP_FAILURE,
    dg.DagsterEventType.ASSET_MATERIALIZATION,
}
_POLL_SECONDS = 0.25
# A step still running this long gets a line saying so, and another every RUNNING_EVERY_SECONDS
# after: a person waiting sees what the run is doing.
RUNNING_AFTER_SECONDS = 5.0
RUNNING_EVERY_SECONDS = 20.0


def step_line(event: dg.DagsterEvent) -> str:
    """``<step> done (1.3 s)`` or ``<step> FAILED``."""
    if event.event_type == dg.DagsterEventType.STEP_SUCCESS:
        seconds = event.event_specific_data.duration_ms / 1000  # type: ignore[union-attr]
        return f"{event.step_key} done ({seconds:.1f} s)"
    return f"{event.step_key} FAILED"


# Dagster writes this straight to standard error, with SQLAlchemy's "(Background on this error
# at: ...)" line, when its run history cannot take a log line (a full disk); the command's one
# line naming DAGSTER_HOME says it once, with what to do.
STORAGE_ECHO = "Exception while writing logger call to event log: "


class _WithoutStorageEchoes:
    """A text stream that drops Dagster's :data:`STORAGE_ECHO` writes and passes the rest."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return len(text) if text.startswith(STORAGE_ECHO) else self.stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def drop_storage_echoes() -> None:
    """From now on, this process's standard error drops :data:`STORAGE_ECHO` (a step's process:
    assets/worker.py)."""
    if not isinstance(sys.stderr, _WithoutStorageEchoes):
        sys.stderr = _WithoutStorageEchoes(sys.stderr)  # type: ignore[assignment]


@contextmanager
def storage_echoes_dropped() -> Iterator[None]:
    """Standard error without :data:`STORAGE_ECHO` while the block runs (the run's own
    process), restored after."""
    before = sys.stderr
    drop_storage_echoes()
    try:
        yield
    finally:
        sys.stderr = before


def to_stderr(line: str) -> None:
    # One write per line: steps finishing together never interleave mid-line.
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def command_progress(command: str) -> Callable[[str], None]:
    """Progress lines on standard error, each starting ``enginefit <command>:``."""
    return lambda line: to_stderr(f"enginefit {command}: {line}")


class StepLines:
    """Turns a run's events into lines: one per finished step, and for an asset made of
    several steps (ingest's files, the simulation's scenarios) one more when its last step
    finishes, with the time its steps took together."""

    def __init__(self) -> None:
        self._graph_seconds: dict[str, float] = {}
        self._graph_steps: dict[str, int] = {}
        self._materializes: dict[str, str] = {}  # step key → the graph asset it completes
        # Step key → when it was seen starting, and when its next "running" line is due.
        self._running: dict[str, tuple[float, float]] = {}

    def started(self, key: str, now: float) -> None:
        self._running[key] = (now, now + RUNNING_AFTER_SECONDS)

    def overdue(self, now: float) -> list[str]:
        """A line for each step running past its next due time (``now``: the clock
        :meth:`started` was given)."""
        lines = []
        for key, (start, due) in sorted(self._running.items()):
            if now >= due:
                lines.append(f"{key} running ({now - start:.0f} s so far)")
                self._running[key] = (start, due + RUNNING_EVERY_SECONDS)
        return lines

    def lines(self, event: dg.DagsterEvent, now: float) -> list[str]:
        key = event.step_key or ""
        graph = key.split(".", 1)[0] if "." in key else None
        if event.event_type == dg.DagsterEventType.STEP_START:
            self.started(key, now)
            return []
        if event.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION:
            asset = event.asset_key.to_user_string() if event.asset_key else None
            if graph is not None and asset == graph:
                self._materializes[key] = asset
            return []
        self._running.pop(key, None)
        lines = [step_line(event)]
        if graph is not None and event.event_type == dg.DagsterEventType.STEP_SUCCESS:
            seconds = event.event_specific_data.duration_ms / 1000  # type: ignore[union-attr]
            self._graph_seconds[graph] = self._graph_seconds.get(graph, 0.0) + seconds
            self._graph_steps[graph] = self._graph_steps.get(graph, 0) + 1
            if key in self._materializes:
                lines.append(
                    f"{graph} done ({self._graph_seconds[graph]:.1f} s over "
                    f"{self._graph_steps[graph]} steps)"
                )
        return lines


class _RunWatcher:
    """Prints each step's end as the event log records it, for the one run tagged ``tags``."""

    def __init__(
        self, instance: dg.DagsterInstance, tags: dict[str, str], emit: Callable[[str], None]
    ) -> None:
        self._instance = instance
        self._tags = tags
        self._emit = emit
        self._run_id: str | None = None
        self._cursor: str | None = None
        self._lines = StepLines()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="enginefit-progress", daemon=True)

    def _drain(self) -> None:
        if self._run_id is None:
            ids = self._instance.get_run_ids(filters=dg.RunsFilter(tags=self._tags), limit=1)
            if not ids:
                return
            self._run_id = ids[0]
        while True:
            page = self._instance.get_records_for_run(
                self._run_id, cursor=self._cursor, of_type=_WATCHED, limit=100
            )
            self._cursor = page.cursor
            for record in page.records:
                event = record.event_log_entry.dagster_event
                now = time.monotonic()
                for line in self._lines.lines(event, now) if event is not None else []:
                    self._emit(line)
            if not page.has_more:
                return

    def _loop(self) -> None:
        while not self._stop.wait(_POLL_SECONDS):
            self._drain()
            for line in self._lines.overdue(time.monotonic()):
                self._emit(line)

    def __enter__(self) -> _RunWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._drain()  # whatever ended after the last poll, before the caller's summary


@contextmanager
def watch_steps(
    instance: dg.DagsterInstance, tags: dict[str, str], emit: Callable[[str], None] | None
) -> Iterator[None]:
    """While the body runs the job tagged ``tags``, ``emit`` a line per finished step. An
    ephemeral instance (tests) keeps its events in memory, in one thread: nothing is emitted."""
    if emit is None or instance.is_ephemeral:
        yield
        return
    # Its own instance on the same storage: the run writes through the caller's meanwhile.
    with dg.DagsterInstance.from_ref(instance.get_ref()) as reader, _RunWatcher(reader, tags, emit):
        yield
