"""Where every output of a workload lives. No other module writes a file name.

A workload folder (``<paths.data_dir>/<workload.name>/``)::

    .enginefit-workload               marker: enginefit made this folder and may replace its files
    .enginefit.lock                   advisory lock held while a command writes the workload (on
                                      object storage: the lease of the machine writing it)
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
    whatif/                           scenarios and the decision map (what-if stage)
    days/<YYYY-MM-DD>/                with daily partitions: each day's own ingest set (same
                                      names), which requests/ above links (pipeline.ingest.days)
    days/.request-ids/                per day: the hashes of its request ids, compared across
                                      days without reading the days' parts
    days/.union/<YYYY-MM-DD>/         a day as the union holds it when an earlier day has some
                                      of its request ids (those quarantined): an ingest set

Each stage's paths are one small frozen object (``layout.shape.summary`` …); stages read each
other's outputs only through these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from pipeline.errors import ConfigError, StageOutputMissingError
from pipeline.remote import Mirror

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
        raise StageOutputMissingError(
            f"{path}: no {what}; run `enginefit {command} --config FILE` or materialise "
            f"`{asset}` first"
        )
    return path


@dataclass(frozen=True)
class _StagePaths:
    """A stage's folder and its files by attribute: each subclass names its files once, as
    defaults relative to ``dir``, which construction resolves."""

    dir: Path

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name != "dir":
                object.__setattr__(self, f.name, self.dir / getattr(self, f.name))

    def files(self) -> dict[str, Path]:
        """Every output file of the stage, by name (folders excluded)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "dir"}


@dataclass(frozen=True)
class IngestPaths(_StagePaths):
    requests: Path = Path("requests")
    quarantine: Path = Path("quarantine.parquet")
    summary: Path = Path("ingest_summary.json")
    manifest: Path = Path("ingest_manifest.json")

    def part(self, index: int) -> Path:
        return self.requests / f"part-{index:05d}.parquet"

    def parts(self) -> list[Path]:
        return sorted(p for p in self.requests.glob("part-*.parquet") if PART_NAME.match(p.name))


@dataclass(frozen=True)
class ShapePaths(_StagePaths):
    summary: Path = Path("workload_shape.json")
    facts: Path = Path("workload_facts.json")
    concurrency: Path = Path("concurrency.parquet")
    lengths_svg: Path = Path("lengths_cdf.svg")
    arrivals_svg: Path = Path("arrivals.svg")
    concurrency_svg: Path = Path("concurrency.svg")


@dataclass(frozen=True)
class PrefixPaths(_StagePaths):
    summary: Path = Path("prefix_sharing.json")
    curve: Path = Path("curve.parquet")
    sessions: Path = Path("sessions.parquet")
    curve_svg: Path = Path("curve.svg")


@dataclass(frozen=True)
class SimulationPaths(_StagePaths):
    scenario_dir: Path = Path("scenarios")
    scenarios: Path = Path("scenarios.parquet")
    replicas: Path = Path("replicas.parquet")
    summary: Path = Path("scenarios.json")
    curves: Path = Path("curves.parquet")
    curves_json: Path = Path("curves.json")
    hit_ratio_svg: Path = Path("hit_ratio_vs_capacity.svg")
    imbalance_svg: Path = Path("imbalance_vs_hit_ratio.svg")

    def scenario(self, key: str) -> Path:
        """One scenario's summary (written by its own step, collected into ``summary``)."""
        return self.scenario_dir / f"{key}.json"


@dataclass(frozen=True)
class DecisionPaths(_StagePaths):
    record: Path = Path("decision.json")
    schema: Path = Path("decision.schema.json")
    triggers: Path = Path("triggers.parquet")
    rationale: Path = Path("rationale.txt")


@dataclass(frozen=True)
class BenchPaths(_StagePaths):
    load_points: Path = Path("load_points.parquet")
    per_request: Path = Path("per_request.parquet")
    read_notes: Path = Path("read_notes.json")
    points: Path = Path("slo_points.parquet")
    capacity: Path = Path("slo_capacity.parquet")
    fleet: Path = Path("fleet.parquet")
    findings: Path = Path("validity_findings.parquet")
    findings_json: Path = Path("validity_findings.json")
    analysis: Path = Path("bench_analysis.json")
    latency_svg: Path = Path("latency_vs_load.svg")
    cost_svg: Path = Path("cost_per_1m_at_slo.svg")
    concurrency: Path = Path("concurrency_by_engine.parquet")
    concurrency_json: Path = Path("concurrency_by_engine.json")


@dataclass(frozen=True)
class CapacityPaths(_StagePaths):
    result: Path = Path("capacity.json")
    candidates: Path = Path("candidates.parquet")
    model_errors: Path = Path("model_errors.parquet")


@dataclass(frozen=True)
class WhatifPaths(_StagePaths):
    result: Path = Path("whatif.json")
    map_svg: Path = Path("decision_map.svg")


@dataclass(frozen=True)
class WorkloadLayout:
    """Every path of one workload's outputs, under ``root``; ``remote``: the folder on object
    storage that ``root`` mirrors (``paths.data_dir`` an ``s3://`` URL, :mod:`pipeline.mirror`),
    where each set a stage commits is uploaded."""

    root: Path
    remote: Mirror | None = field(default=None, compare=False)

    @property
    def name(self) -> str:
        """The workload's name: its folder is named after it (``<paths.data_dir>/<name>``)."""
        return self.root.name

    @property
    def ingest(self) -> IngestPaths:
        return IngestPaths(self.root)

    @property
    def days_dir(self) -> Path:
        """Daily partitions: one ingest set per UTC day below (:mod:`pipeline.ingest.days`)."""
        return self.root / "days"

    def day(self, day: str) -> WorkloadLayout:
        """The ingest set of one day (``YYYY-MM-DD``), laid out as a workload of its own."""
        folder = child_folder(self.days_dir, day, "partition")
        remote = self.remote.child("days").child(day) if self.remote else None
        return WorkloadLayout(folder, remote)

    def day_request_ids(self, day: str, version: str) -> Path:
        """The hashes of the request ids of ``day``'s set as ``version`` names it (its manifest's
        digest and the hash function's)."""
        name = child_folder(self.days_dir, day, "partition").name
        return self.days_dir / ".request-ids" / f"{name}.{version}.parquet"

    def day_in_union(self, day: str) -> WorkloadLayout:
        """``day``'s set as the union holds it when an earlier day has some of its request ids."""
        return WorkloadLayout(child_folder(self.days_dir / ".union", day, "partition"))

    @property
    def marker(self) -> Path:
        """Present in every folder enginefit made a workload of (what may be replaced in it)."""
        return self.root / WORKLOAD_MARKER

    @property
    def lock(self) -> Path:
        return self.root / WORKLOAD_LOCK

    @property
    def shape(self) -> ShapePaths:
        return ShapePaths(self.root / "shape")

    @property
    def shape_day_parts(self) -> Path:
        """The shape's per-day parts of a workload published from days
        (:mod:`pipeline.shape.daily`), kept between runs."""
        return self.shape.dir / "days"

    @property
    def concurrency_day_parts(self) -> Path:
        """The per-day concurrency sweeps under each benchmark's fitted latency model of a
        workload published from days (:class:`pipeline.shape.stage.ModelSweeps`), one folder a
        model, kept between runs."""
        return self.bench.dir / "days"

    @property
    def scenario_passes(self) -> Path:
        """The streamed scenario replay's kept pass of a workload published from days
        (:mod:`pipeline.sim.resume`), kept between runs."""
        return self.simulation.dir / "resume"

    @property
    def prefix_passes(self) -> Path:
        """The prefix stage's kept passes and day summaries of a workload published from days
        (:mod:`pipeline.prefix.days`), kept between runs."""
        return self.prefix.dir / "resume"

    @property
    def fleet_passes(self) -> Path:
        """The capacity stage's fleet replays' kept passes of a workload published from days
        (:mod:`pipeline.sim.resume`), kept between runs."""
        return self.capacity.dir / "resume"

    @property
    def prefix(self) -> PrefixPaths:
        return PrefixPaths(self.root / "prefix")

    @property
    def simulation(self) -> SimulationPaths:
        return SimulationPaths(self.root / "simulation")

    @property
    def bench(self) -> BenchPaths:
        return BenchPaths(self.root / "bench")

    @property
    def capacity(self) -> CapacityPaths:
        return CapacityPaths(self.root / "capacity")

    @property
    def decision(self) -> DecisionPaths:
        return DecisionPaths(self.root / "decision")

    @property
    def whatif(self) -> WhatifPaths:
        return WhatifPaths(self.root / "whatif")
