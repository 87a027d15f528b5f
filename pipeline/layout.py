"""Where every output of a workload lives. No other module writes a file name.

A workload folder (``<paths.data_dir>/<workload.name>/``)::

    .enginefit-workload               marker: enginefit made this folder and may replace its files
    .enginefit.lock                   advisory lock held while a command writes the workload
    requests/part-00000.parquet ...   canonical request table (ingest)
    quarantine.parquet                records not ingested, with file, line, field, reason
    ingest_summary.json               counts that reconcile: read = ingested + quarantined
    ingest_manifest.json              written last: the part files, sizes and digests of one set
    shape/                            workload shape (shape stage)
    prefix/                           prefix sharing, reuse and sessions (prefix stage)
    simulation/                       cache and routing replay (simulation stage)
    bench/                            benchmark join, SLO capacity and cost (bench stage)
    capacity/                         capacity and cost for this workload's own mix (capacity stage)
    decision/                         the decision record, its schema and rationale
    days/<YYYY-MM-DD>/                with daily partitions: each day's own ingest set (same
                                      names), which requests/ above links (pipeline.ingest.days)

Each stage's paths are one small frozen object (``layout.shape.summary`` …); stages read each
other's outputs only through these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path

from pipeline.errors import ConfigError, InputFormatError

# A name that becomes one folder under a configured root: no '/', no '..', no leading '.'.
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
PART_NAME = re.compile(r"^part-\d{5}\.parquet$")
WORKLOAD_MARKER = ".enginefit-workload"
WORKLOAD_LOCK = ".enginefit.lock"


@dataclass(frozen=True)
class LoadtestRunPaths:
    """One ``enginefit loadtest`` run's folder (beside other benchmark results): its
    ``vllm-<rate>qps.json`` results with a sidecar manifest, and its own side files."""

    root: Path

    @property
    def marker(self) -> Path:
        return self.root / ".enginefit-loadtest"

    @property
    def manifest(self) -> Path:
        return self.root / "enginefit-bench.yaml"

    @property
    def requests(self) -> Path:
        return self.root / "loadtest-requests.parquet"

    @property
    def points(self) -> Path:
        return self.root / "loadtest-points.parquet"

    @property
    def record(self) -> Path:
        return self.root / "loadtest-run.json"

    def rate_result(self, rate_rps: float) -> Path:
        return self.root / f"vllm-{rate_rps:g}qps.json"


#: A run's own files, which the bench readers pass over when they walk a results folder.
LOADTEST_SIDE_FILES = frozenset(
    p.name
    for p in (
        LoadtestRunPaths(Path()).marker,
        LoadtestRunPaths(Path()).requests,
        LoadtestRunPaths(Path()).points,
        LoadtestRunPaths(Path()).record,
    )
)


def child_folder(root: Path, name: str, what: str) -> Path:
    """``root / name`` for a safe one-folder ``name``, so an output never lands outside ``root``."""
    if not SAFE_NAME.match(name):
        raise ConfigError(
            f"{what}: {name!r} is not a safe folder name: use letters, digits, '.', '_' and '-' "
            "(it names a folder, so no '/' or '..')"
        )
    return root / name


def require_output(path: Path, what: str, command: str, asset: str) -> Path:
    """``path`` when an earlier stage wrote it, else an error saying how to produce it."""
    if not path.exists():
        raise InputFormatError(
            f"{path}: no {what}; run `enginefit {command} --config FILE` or materialise "
            f"`{asset}` first"
        )
    return path


@dataclass(frozen=True)
class _StagePaths:
    """Common behaviour: the stage folder and the files in it, by attribute."""

    dir: Path

    def files(self) -> dict[str, Path]:
        """Every output file of the stage, by name (folders excluded)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "dir"}


@dataclass(frozen=True)
class IngestPaths(_StagePaths):
    requests: Path
    quarantine: Path
    summary: Path
    manifest: Path

    def part(self, index: int) -> Path:
        return self.requests / f"part-{index:05d}.parquet"

    def parts(self) -> list[Path]:
        return sorted(p for p in self.requests.glob("part-*.parquet") if PART_NAME.match(p.name))


@dataclass(frozen=True)
class ShapePaths(_StagePaths):
    summary: Path
    facts: Path
    concurrency: Path
    lengths_svg: Path
    arrivals_svg: Path
    concurrency_svg: Path


@dataclass(frozen=True)
class PrefixPaths(_StagePaths):
    summary: Path
    curve: Path
    sessions: Path
    curve_svg: Path


@dataclass(frozen=True)
class SimulationPaths(_StagePaths):
    scenario_dir: Path
    scenarios: Path
    replicas: Path
    summary: Path
    curves: Path
    curves_json: Path
    hit_ratio_svg: Path
    imbalance_svg: Path

    def scenario(self, key: str) -> Path:
        """One scenario's summary (written by its own step, collected into ``summary``)."""
        return self.scenario_dir / f"{key}.json"


@dataclass(frozen=True)
class DecisionPaths(_StagePaths):
    record: Path
    schema: Path
    triggers: Path
    rationale: Path


@dataclass(frozen=True)
class BenchPaths(_StagePaths):
    load_points: Path
    per_request: Path
    read_notes: Path
    points: Path
    capacity: Path
    fleet: Path
    findings: Path
    findings_json: Path
    analysis: Path
    latency_svg: Path
    cost_svg: Path
    concurrency: Path
    concurrency_json: Path


@dataclass(frozen=True)
class CapacityPaths(_StagePaths):
    result: Path
    candidates: Path
    model_errors: Path


@dataclass(frozen=True)
class WorkloadLayout:
    """Every path of one workload's outputs, under ``root``."""

    root: Path

    @property
    def ingest(self) -> IngestPaths:
        return IngestPaths(
            dir=self.root,
            requests=self.root / "requests",
            quarantine=self.root / "quarantine.parquet",
            summary=self.root / "ingest_summary.json",
            manifest=self.root / "ingest_manifest.json",
        )

    @property
    def days_dir(self) -> Path:
        """Daily partitions: one ingest set per UTC day below (:mod:`pipeline.ingest.days`)."""
        return self.root / "days"

    def day(self, day: str) -> WorkloadLayout:
        """The ingest set of one day (``YYYY-MM-DD``), laid out as a workload of its own."""
        return WorkloadLayout(child_folder(self.days_dir, day, "partition"))

    @property
    def marker(self) -> Path:
        """Present in every folder enginefit made a workload of (what may be replaced in it)."""
        return self.root / WORKLOAD_MARKER

    @property
    def lock(self) -> Path:
        return self.root / WORKLOAD_LOCK

    @property
    def shape(self) -> ShapePaths:
        d = self.root / "shape"
        return ShapePaths(
            dir=d,
            summary=d / "workload_shape.json",
            facts=d / "workload_facts.json",
            concurrency=d / "concurrency.parquet",
            lengths_svg=d / "lengths_cdf.svg",
            arrivals_svg=d / "arrivals.svg",
            concurrency_svg=d / "concurrency.svg",
        )

    @property
    def prefix(self) -> PrefixPaths:
        d = self.root / "prefix"
        return PrefixPaths(
            dir=d,
            summary=d / "prefix_sharing.json",
            curve=d / "curve.parquet",
            sessions=d / "sessions.parquet",
            curve_svg=d / "curve.svg",
        )

    @property
    def simulation(self) -> SimulationPaths:
        d = self.root / "simulation"
        return SimulationPaths(
            dir=d,
            scenario_dir=d / "scenarios",
            scenarios=d / "scenarios.parquet",
            replicas=d / "replicas.parquet",
            summary=d / "scenarios.json",
            curves=d / "curves.parquet",
            curves_json=d / "curves.json",
            hit_ratio_svg=d / "hit_ratio_vs_capacity.svg",
            imbalance_svg=d / "imbalance_vs_hit_ratio.svg",
        )

    @property
    def bench(self) -> BenchPaths:
        d = self.root / "bench"
        return BenchPaths(
            dir=d,
            load_points=d / "load_points.parquet",
            per_request=d / "per_request.parquet",
            read_notes=d / "read_notes.json",
            points=d / "slo_points.parquet",
            capacity=d / "slo_capacity.parquet",
            fleet=d / "fleet.parquet",
            findings=d / "validity_findings.parquet",
            findings_json=d / "validity_findings.json",
            analysis=d / "bench_analysis.json",
            latency_svg=d / "latency_vs_load.svg",
            cost_svg=d / "cost_per_1m_at_slo.svg",
            concurrency=d / "concurrency_by_engine.parquet",
            concurrency_json=d / "concurrency_by_engine.json",
        )

    @property
    def capacity(self) -> CapacityPaths:
        d = self.root / "capacity"
        return CapacityPaths(
            dir=d,
            result=d / "capacity.json",
            candidates=d / "candidates.parquet",
            model_errors=d / "model_errors.parquet",
        )

    @property
    def decision(self) -> DecisionPaths:
        d = self.root / "decision"
        return DecisionPaths(
            dir=d,
            record=d / "decision.json",
            schema=d / "decision.schema.json",
            triggers=d / "triggers.parquet",
            rationale=d / "rationale.txt",
        )
