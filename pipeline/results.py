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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pipeline.layout import WorkloadLayout, require_output


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

    def paths(self, layout: WorkloadLayout) -> list[Path]:
        folder = getattr(layout, self.folder)
        return [getattr(folder, name) for name in self.files]

    def require(self, layout: WorkloadLayout) -> Path:
        """The main file when its stage wrote it, else the error naming what writes it."""
        assert self.files, f"{self.what}: no file to require"  # the request table's is its manifest
        main = getattr(getattr(layout, self.folder), self.files[0])
        return require_output(main, self.what, self.command, self.asset)

    def reading(self, *files: str) -> Result:
        """The same result, fingerprinted by ``files`` (none: read, but made only of results
        fingerprinted beside it)."""
        return dataclasses.replace(self, files=files)


# The canonical table is checked against its ingest manifest whenever it is read; a decision
# or a report does not hash its parts again (gigabytes at a quarter of traffic).
REQUESTS = Result("canonical request table", "ingest", "workload", "ingest", ())
INGEST_SUMMARY = Result("ingest summary", "ingest", "workload", "ingest", ("summary",))
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


def fingerprints(step: Step, layout: WorkloadLayout) -> Iterable[Path]:
    """The upstream files ``step`` fingerprints, in declaration order (those written or not)."""
    for result in step.upstream:
        yield from result.paths(layout)
