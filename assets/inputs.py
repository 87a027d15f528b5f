"""What the pipeline reads from outside the asset graph, as observable source assets: the trace
files, the benchmark result files, each section of the configuration a stage takes, and the
workload folder the stages write to; and each asset's ``deps``, derived from the steps the
stages declare (:class:`pipeline.results.Step`).

Each observation's data version hashes what it watches (a file's path, size and modification
time; a section's settings), so Dagster knows a stage is stale when one of its inputs changed
since it last ran: ``enginefit decide`` materialises exactly those stages
(:func:`assets.definitions.materialise_stale`), and ``enginefit report`` records them with every
run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from pipeline.bench import stage as bench
from pipeline.bench.readers import expand_paths as bench_files
from pipeline.capacity import stage as capacity
from pipeline.config import Config
from pipeline.decision import stage as decision
from pipeline.ingest import stage as ingest
from pipeline.ingest.compute import expand_paths as trace_files
from pipeline.layout import WorkloadLayout
from pipeline.mirror import Wanted
from pipeline.prefix import stage as prefix
from pipeline.report import stage as report
from pipeline.results import Step, markers
from pipeline.settings import SECTIONS
from pipeline.shape import stage as shape
from pipeline.sim import stage as sim
from pipeline.whatif import stage as whatif

TRACE_FILES = "trace_files"
BENCH_RESULT_FILES = "bench_result_files"
# Where the stages write (``<paths.data_dir>/<workload.name>``): the first stages read it, so
# outputs another configuration wrote to another folder do not count as this one's.
WORKLOAD_FOLDER = "workload_folder"

#: Every step of every stage: one asset each.
STEPS: tuple[Step, ...] = (
    ingest.STEP,
    shape.STEP,
    prefix.STEP,
    *sim.STEPS,
    *bench.STEPS,
    capacity.STEP,
    *decision.STEPS,
    whatif.STEP,
    report.STEP,
)
# Each section a step takes, as an input of its own (in the order the configuration prints).
CONFIG_SECTIONS = tuple(name for name in SECTIONS if any(name in step.sections for step in STEPS))


def config_key(section: str) -> str:
    return f"config_{section}"


def step_deps(step: Step, *outside: str) -> list[str]:
    """The keys of what ``step``'s asset depends on: the assets that write the results it reads,
    the configuration sections it takes, and ``outside`` inputs (the files it reads itself)."""
    return [*step.upstream_assets(), *(config_key(name) for name in step.sections), *outside]


_BY_ASSET = {step.asset: step for step in STEPS}
# The steps that read the published report versions as well: the decision (the previous
# version's record) and the report (the ledger it files the next version in).
_READ_VERSIONS = frozenset({decision.STEP.asset, report.STEP.asset})


#: A day's shape counts (``assets.days.shape_day_asset``), made ahead of the shape.
SHAPE_DAY = "workload_shape_day"


def step_reads(
    layout: WorkloadLayout,
    assets: Iterable[str],
    checked: Iterable[str],
    *,
    daily: bool,
    partition: str | None = None,
) -> tuple[Wanted, bool]:
    """What a step materialising ``assets`` and checking ``checked`` (asset names) reads of the
    workload folder ``layout`` (as :func:`pipeline.mirror.pull` takes it), and whether it reads
    the published versions: each asset's declared upstream results, each checked asset's own
    result; the union of a ``daily`` workload's days reads the days, and a day's shape counts
    (its ``partition``) that day's set (:func:`pipeline.shape.stage.day_reads`)."""
    assets = list(assets)
    read = [result for name in assets if name in _BY_ASSET for result in _BY_ASSET[name].upstream]
    read += [_BY_ASSET[name].writes for name in checked if name in _BY_ASSET]
    wanted: dict[str, Collection[str] | None] = dict(markers(read, layout))
    if daily and ingest.STEP.asset in assets:
        wanted[layout.days_dir.relative_to(layout.root).as_posix() + "/"] = None
    if SHAPE_DAY in assets and partition is not None:
        wanted |= shape.day_reads(layout, partition)
    return wanted, bool(_READ_VERSIONS.intersection(assets))


def digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _stat(paths: list[Path]) -> list[tuple[str, int, int]]:
    """Path, size and modification time of each file (-1, -1: unreadable)."""
    out = []
    for path in sorted(set(paths)):
        try:
            stat = path.stat()
        except OSError:
            out.append((str(path), -1, -1))
            continue
        out.append((str(path), stat.st_size, stat.st_mtime_ns))
    return out


def trace_fingerprint(config: Config) -> str:
    """Every configured trace file's path, size and modification time, hashed."""
    workload = config.require_workload()
    return digest(_stat([Path(s.path) for t in workload.traces for s in trace_files([t.path])]))


def input_versions(config: Config) -> dict[str, str]:
    """The data version of every outside input, by asset key."""
    settings = config.as_dict()
    results, _ = bench_files(list(config.bench.results))
    versions = {config_key(name): digest(settings[name]) for name in CONFIG_SECTIONS}
    versions[WORKLOAD_FOLDER] = digest(str(config.layout().root))
    versions[TRACE_FILES] = trace_fingerprint(config)
    versions[BENCH_RESULT_FILES] = digest(_stat(results))
    return versions


INPUT_KEYS = [
    TRACE_FILES,
    BENCH_RESULT_FILES,
    WORKLOAD_FOLDER,
    *(config_key(name) for name in CONFIG_SECTIONS),
]
DESCRIPTIONS = {
    TRACE_FILES: "The configured trace files.",
    BENCH_RESULT_FILES: "The configured benchmark result files.",
    WORKLOAD_FOLDER: "The folder the stages write this workload's outputs to.",
    **{config_key(name): f"The {name} section of the configuration." for name in CONFIG_SECTIONS},
}
