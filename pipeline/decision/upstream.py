"""What ``enginefit decide`` must (re)compute before deciding: every upstream stage whose
outputs are missing *or were made under another configuration or from other input files*.

Each stage's fingerprint hashes its configuration section, the stat (path, size, modification
time) of the files it reads directly, and the fingerprints of the stages it reads; the
fingerprints of the last computation are kept in the workload folder
(``.enginefit-upstream.json``). A stage whose fingerprint changed runs again, and so does
everything after it. Another command or the Dagster graph may also have rewritten a stage;
then the stored fingerprint no longer matches and the stage simply runs once more.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.config import Config
from pipeline.layout import WorkloadLayout
from pipeline.store import write_json_atomic

STAGES = ("ingest", "shape", "prefix", "simulation", "bench")


def digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _stat(paths: list[Path]) -> list[tuple[str, int, int]]:
    out = []
    for path in sorted(set(paths)):
        try:
            stat = path.stat()
        except OSError:
            out.append((str(path), -1, -1))
            continue
        out.append((str(path), stat.st_size, stat.st_mtime_ns))
    return out


def trace_stats(config: Config) -> list[tuple[str, int, int]]:
    """Path, size and modification time of every configured trace file (-1: unreadable)."""
    from pipeline.ingest.compute import expand_paths as trace_files

    workload = config.require_workload()
    return _stat([Path(s.path) for t in workload.traces for s in trace_files([t.path])])


def fingerprints(config: Config) -> dict[str, str]:
    from pipeline.bench.readers import expand_paths as bench_files

    ingest = digest(config.as_dict()["workload"], trace_stats(config))
    results, _ = bench_files(list(config.bench.results))
    shape = digest(ingest, config.shape.model_dump(mode="json"))
    prefix = digest(ingest, config.prefix.model_dump(mode="json"))
    config_dict = config.as_dict()
    return {
        "ingest": ingest,
        "shape": shape,
        "prefix": prefix,
        "simulation": digest(ingest, config_dict["simulation"], config_dict["shape"]),
        "bench": digest(shape, prefix, config_dict["bench"], _stat(results)),
    }


def _store(layout: WorkloadLayout) -> Path:
    return layout.root / ".enginefit-upstream.json"


def stale(config: Config, layout: WorkloadLayout, present: dict[str, bool]) -> list[str]:
    """The stages to run, in order: missing outputs, or a fingerprint that changed (and every
    stage after one that runs)."""
    now = fingerprints(config)
    try:
        before = json.loads(_store(layout).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        before = {}
    return [s for s in STAGES if not present[s] or before.get(s) != now[s]]


def remember(config: Config, layout: WorkloadLayout) -> None:
    write_json_atomic(_store(layout), fingerprints(config))


def ensure(config: Config, layout: WorkloadLayout, run: dict[str, Callable[[], None]]) -> list[str]:
    """Run the stale stages (``run[name]()``) in order and remember what they were made from."""
    present = {
        "ingest": layout.ingest.summary.is_file(),
        "shape": layout.shape.summary.is_file(),
        "prefix": layout.prefix.summary.is_file(),
        "simulation": layout.simulation.summary.is_file() and layout.simulation.curves.is_file(),
        "bench": layout.bench.analysis.is_file() and layout.bench.concurrency_json.is_file(),
    }
    todo = stale(config, layout, present)
    for name in todo:
        run[name]()
    remember(config, layout)
    return todo
