"""The results stages hand each other, and each step's place in the graph, declared once.

A :class:`Result` is what one asset writes for later stages to read: how a message names it,
the command and the Dagster asset that write it, and its files in the workload folder
(:mod:`pipeline.layout`). A stage's ``stage.py`` declares each of its steps as a :class:`Step`:
the result it writes, the upstream results it reads and the configuration sections its inputs
come from. Everything else derives from those declarations: the assets' ``deps``
(:func:`assets.inputs.step_deps`), the configuration inputs Dagster watches, and the files a
decision record and a report version fingerprint (:func:`fingerprints`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import polars as pl

from pipeline.digests import sha256_file
from pipeline.errors import (
    InputFormatError,
    StageOutputMissingError,
    StageOutputStaleError,
    StageOutputUnreadableError,
)
from pipeline.layout import WorkloadLayout, require_output
from pipeline.mirror import push_set
from pipeline.safe_read import read_json
from pipeline.store import write_json_atomic

T = TypeVar("T")


@dataclass(frozen=True)
class Result:
    """One result later stages read. ``files`` name its files in its stage's folder of the
    layout (``folder``: ``layout.<folder>``), the main one first; they are what a stage that
    reads it fingerprints, unless it declares it :meth:`reading` other files."""

    what: str
    command: str
    asset: str
    folder: str
    files: tuple[str, ...]
    #: Its stage seals what it writes (:meth:`seal`): one without a seal cannot be trusted.
    sealed: bool = True

    def paths(self, layout: WorkloadLayout) -> list[Path]:
        folder = getattr(layout, self.folder)
        return [getattr(folder, name) for name in self.files]

    def require(self, layout: WorkloadLayout) -> Path:
        """The main file when its stage wrote it and nothing changed it since (its seal), else
        the error naming what writes it: :class:`~pipeline.errors.StageOutputMissingError` when it
        was never written, an :class:`InputFormatError` saying to re-run the stage when it
        was damaged."""
        assert self.files, f"{self.what}: no file to require"  # the request table's is its manifest
        main = require_output(self.paths(layout)[0], self.what, self.command, self.asset)
        self.check_seal(layout)
        return main

    def read(self, layout: WorkloadLayout, reader: Callable[[], T]) -> T:
        """``reader()``, which reads this result from ``layout``: a result never written stays
        :class:`~pipeline.errors.StageOutputMissingError` (a caller may go on without it); one that
        exists but cannot be read, whatever the reader tripped on, is the error naming the
        file and the command that rewrites it, so it is never taken for missing."""
        try:
            return reader()
        except (StageOutputMissingError, StageOutputUnreadableError):
            raise
        except InputFormatError as exc:
            raise self.unreadable(str(exc)) from exc
        except (pl.exceptions.PolarsError, OSError, LookupError, TypeError, ValueError) as exc:
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            main = self.paths(layout)[0] if self.files else getattr(layout, self.folder).dir
            raise self.unreadable(f"{main}: {type(exc).__name__}: {detail}"[:400]) from exc

    def rerun(self) -> str:
        """What rewrites this result."""
        return f"re-run `enginefit {self.command} --config FILE` (or materialise `{self.asset}`)"

    def unreadable(self, problem: str) -> StageOutputUnreadableError:
        """The error for an output of this result that exists but cannot be read."""
        return StageOutputUnreadableError(
            f"{problem}: the {self.what} cannot be read; {self.rerun()}"
        )

    def seal_path(self, layout: WorkloadLayout) -> Path:
        return self._folder(layout) / f".{self.asset}.sha256.json"

    def seal(
        self,
        layout: WorkloadLayout,
        written: Iterable[Path] = (),
        inputs: Mapping[str, str] | None = None,
    ) -> Path:
        """Record the sha256 of each file this result's stage just wrote (``written``, else
        the result's own files), called last by the stage's ``write``: a write cut short
        leaves a seal that no longer matches, and the next reader says to re-run the stage.
        ``inputs``: what the result was computed from (a name → its digest), which
        :meth:`check_inputs` compares with the inputs configured now."""
        folder = self._folder(layout)
        files = sorted({*written, *self.paths(layout)})
        digests = {
            path.relative_to(folder).as_posix(): sha256_file(path)
            for path in files
            if path.is_file()
        }
        target = self.seal_path(layout)
        record: dict[str, object] = {"result": self.what, "sha256": digests}
        if inputs is not None:
            record["inputs"] = dict(sorted(inputs.items()))
        write_json_atomic(target, record)
        if layout.remote is not None:
            push_set(layout.remote, files, target)
        return target

    def check_inputs(self, layout: WorkloadLayout, current: Mapping[str, str], named: str) -> None:
        """This result (sealed, unchanged) was computed from ``current``, the inputs
        configured now (``named`` says which, for the message); else
        :class:`StageOutputStaleError` naming its file, the first input that differs and what
        rewrites it, so a later stage never reuses it silently."""
        main = self.require(layout)
        recorded = read_json(self.seal_path(layout)).get("inputs")
        if not isinstance(recorded, dict):
            changed = "it records no inputs: an earlier enginefit wrote it"
        else:
            changed = next(
                (
                    _input_change(name, recorded.get(name), current.get(name))
                    for name in sorted({*recorded, *current})
                    if recorded.get(name) != current.get(name)
                ),
                "",
            )
        if changed:
            raise StageOutputStaleError(
                f"{main}: computed from other inputs than {named} now ({changed}); {self.rerun()}"
            )

    def check_seal(self, layout: WorkloadLayout) -> None:
        """Each sealed file still has the content its stage wrote. A result its stage seals
        but found without a seal (written by an enginefit before seals, or its seal removed)
        cannot be trusted either: the error says to re-run the stage."""
        seal = self.seal_path(layout)
        if not seal.exists():
            if self.sealed and self.files:
                raise self.unreadable(
                    f"{self.paths(layout)[0]}: no {seal.name} beside it (an earlier enginefit "
                    "wrote it, or its seal was removed), so what it holds cannot be trusted"
                )
            return
        try:
            recorded = read_json(seal)["sha256"]
            if not isinstance(recorded, dict):
                raise TypeError
        except (InputFormatError, TypeError, KeyError) as exc:
            raise self.unreadable(f"{seal}: not a seal enginefit wrote") from exc
        folder = self._folder(layout)
        for name, expected in sorted(recorded.items()):
            relative = Path(str(name))
            if relative.is_absolute() or ".." in relative.parts:
                raise self.unreadable(f"{seal}: names {name!r}, outside {folder}")
            path = folder / relative
            if not path.is_file():
                raise self.unreadable(f"{path}: written by `enginefit {self.command}`, now gone")
            if sha256_file(path) != expected:
                raise self.unreadable(
                    f"{path}: changed since `enginefit {self.command}` wrote it (its sha256 "
                    f"differs from the one in {seal.name})"
                )

    def _folder(self, layout: WorkloadLayout) -> Path:
        return Path(getattr(layout, self.folder).dir)

    def reading(self, *files: str) -> Result:
        """The same result, fingerprinted by ``files`` (none: read, but made only of results
        fingerprinted beside it)."""
        return dataclasses.replace(self, files=files)


def _input_change(name: str, recorded: object, current: str | None) -> str:
    if recorded is None:
        return f"{name} is new"
    if current is None:
        return f"{name} is gone"
    return f"{name} changed"


# The canonical table is checked against its ingest manifest whenever it is read; a decision
# or a report does not hash its parts again (gigabytes at a quarter of traffic).
REQUESTS = Result("canonical request table", "ingest", "workload", "ingest", ())
# The ingest stage checks its outputs against its own manifest instead.
INGEST_SUMMARY = Result(
    "ingest summary", "ingest", "workload", "ingest", ("summary",), sealed=False
)
SHAPE = Result("workload shape", "shape", "workload_shape", "shape", ("summary",))
PREFIX = Result("prefix analysis", "prefix", "prefix_sharing", "prefix", ("summary", "curve"))
SCENARIOS = Result(
    "simulation results", "simulate", "simulation_scenarios", "simulation", ("summary",)
)
CURVES = Result("capacity curves", "simulate", "simulation_curves", "simulation", ("curves",))
SIMULATION_FIGURES = Result(
    "simulation figures",
    "simulate",
    "simulation_plots",
    "simulation",
    ("hit_ratio_svg", "imbalance_svg"),
)
LOAD_POINTS = Result("load points", "bench", "bench_load_points", "bench", ("load_points",))
BENCH = Result(
    "bench analysis",
    "bench",
    "bench_analysis",
    "bench",
    ("analysis", "capacity", "fleet", "findings", "points"),
)
LATENCY_FITS = Result(
    "latency fits", "bench", "concurrency_by_engine", "bench", ("concurrency_json",)
)
CAPACITY = Result("capacity result", "capacity", "workload_capacity", "capacity", ("result",))
DECISION = Result("decision record", "decide", "engine_decision", "decision", ("record",))
TRIGGERS = Result("revisit triggers", "decide", "revisit_triggers", "decision", ("triggers",))
WHATIF = Result("what-if result", "whatif", "decision_map", "whatif", ("result",))
# Published outside the workload folder, as versions of a ledger (pipeline.ledger).
REPORT = Result("selection report", "report", "engine_selection_report", "", ())


@dataclass(frozen=True)
class Step:
    """One asset of a stage: the result it ``writes``, the ``upstream`` results it reads (in
    the order their fingerprints are listed) and the configuration ``sections`` its inputs come
    from (whole, or the values of them its caller passes)."""

    writes: Result
    upstream: tuple[Result, ...] = ()
    sections: tuple[str, ...] = ()

    @property
    def asset(self) -> str:
        return self.writes.asset

    def upstream_assets(self) -> list[str]:
        """The assets it reads, once each, in declaration order."""
        return list(dict.fromkeys(result.asset for result in self.upstream))


def markers(results: Iterable[Result], layout: WorkloadLayout) -> dict[str, frozenset[str] | None]:
    """Where the sets holding ``results`` are committed, each marker relative to the workload
    folder, with the files of the set read (None: every one): what a step reading them pulls
    from object storage (:func:`pipeline.mirror.pull`). The ingest summary read alone is that
    file of the ingest set, not its request parts."""
    wanted: dict[str, frozenset[str] | None] = {}
    for result in results:
        if not result.folder:  # published outside the workload folder
            continue
        files: frozenset[str] | None = None
        if result.folder != REQUESTS.folder:
            marker = result.seal_path(layout)
        else:
            marker = layout.ingest.manifest
            if result.what != REQUESTS.what:
                files = frozenset({layout.ingest.summary.name})
        key = marker.relative_to(layout.root).as_posix()
        before = wanted.get(key, frozenset())
        wanted[key] = None if files is None or before is None else before | files
    return wanted


def fingerprints(step: Step, layout: WorkloadLayout) -> Iterable[Path]:
    """The upstream files ``step`` fingerprints, in declaration order (those written or not)."""
    for result in step.upstream:
        yield from result.paths(layout)
