"""The stage graph is declared once, in each ``stage.py``'s steps (:class:`pipeline.results.Step`),
and everything else agrees with it: the Dagster assets' deps, what each stage's code reads, the
configuration inputs Dagster watches, and the files a decision record and a report version
fingerprint."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import dagster as dg

from assets.definitions import defs
from assets.inputs import (
    BENCH_RESULT_FILES,
    CONFIG_SECTIONS,
    STEPS,
    TRACE_FILES,
    WORKLOAD_FOLDER,
    step_deps,
)
from pipeline import config as config_module
from pipeline import results
from pipeline.decision import stage as decision_stage
from pipeline.layout import WorkloadLayout
from pipeline.ledger import INSTALLATION
from pipeline.report import stage as report_stage
from pipeline.settings import SECTIONS
from tests.conftest import REPO

# What an asset reads from outside the graph (observed files and folders), by asset.
OUTSIDE = {
    "workload": {TRACE_FILES, WORKLOAD_FOLDER},
    "bench_load_points": {BENCH_RESULT_FILES, WORKLOAD_FOLDER},
}
# The layout's stage folders (``layout.<folder>``).
FOLDERS = {"ingest", "shape", "prefix", "simulation", "bench", "capacity", "decision", "whatif"}
# The package of the stage whose folder of the layout a result lives in, where they differ.
PACKAGE_OF_FOLDER = {"simulation": "sim"}


def test_every_asset_depends_on_exactly_what_its_step_declares() -> None:
    graph = defs.resolve_asset_graph()
    for step in STEPS:
        parents = {key.to_user_string() for key in graph.get(dg.AssetKey(step.asset)).parent_keys}
        assert parents == set(step_deps(step)) | OUTSIDE.get(step.asset, set()), step.asset


def test_every_asset_of_the_graph_is_a_declared_step() -> None:
    graph = defs.resolve_asset_graph()
    materialised = {
        key.to_user_string()
        for key in graph.get_all_asset_keys()
        if graph.get(key).is_materializable
    }
    assert materialised == {step.asset for step in STEPS}


def _stage_imports(path: Path) -> set[str]:
    """The other stages a ``stage.py`` imports (``pipeline.<stage>.stage`` or the stage
    module through ``from pipeline.<stage> import stage``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            if parts[0] != "pipeline" or len(parts) < 2:
                continue
            if parts[-1] == "stage" or any(alias.name == "stage" for alias in node.names):
                found.add(parts[1])
    return found


def _steps_of(package: str) -> list[results.Step]:
    module = importlib.import_module(f"pipeline.{package}.stage")
    return [v for v in vars(module).values() if isinstance(v, results.Step)]


def test_a_stage_reads_only_the_results_it_declares() -> None:
    """A ``stage.py`` imports another stage, or names a folder of the layout, only where one of
    its steps declares a result of that stage upstream."""
    for path in sorted((REPO / "pipeline").glob("*/stage.py")):
        package = path.parent.name
        steps = _steps_of(package)
        if not steps:  # the load test reads the canonical table its command hands it
            continue
        upstream = {result for step in steps for result in step.upstream}
        upstream |= {step.writes for step in steps}
        folders = {result.folder for result in upstream}
        packages = {PACKAGE_OF_FOLDER.get(folder, folder) for folder in folders}
        assert _stage_imports(path) - {package} <= packages, package
        named = set(re.findall(r"layout\.(\w+)\.", path.read_text(encoding="utf-8"))) & FOLDERS
        assert named <= folders, f"{package}: reads {sorted(named - folders)} undeclared"


def test_the_decision_fingerprints_the_files_it_reads() -> None:
    """Listed in the record's ``inputs`` in this order (a pinned list: the record's bytes
    depend on it)."""
    layout = WorkloadLayout(Path("w"))
    named = [str(p.relative_to("w")) for p in results.fingerprints(decision_stage.STEP, layout)]
    assert named == [
        "shape/workload_shape.json",
        "prefix/prefix_sharing.json",
        "prefix/curve.parquet",
        "simulation/scenarios.json",
        "simulation/curves.parquet",
        "bench/bench_analysis.json",
        "bench/slo_capacity.parquet",
        "bench/fleet.parquet",
        "bench/validity_findings.parquet",
        "bench/slo_points.parquet",
        "bench/concurrency_by_engine.json",
        "capacity/capacity.json",
    ]


def test_a_report_version_fingerprints_every_upstream_output_it_is_made_of() -> None:
    """Every file of the shape and prefix stages, the simulation's tables, the bench stage's
    outputs but the per-request rows (the result files' own, hashed as inputs), the capacity
    document and the ingest summary; not the decision record (published in the version) nor
    the what-if result."""
    layout = WorkloadLayout(Path("w"))
    named = sorted(str(p.relative_to("w")) for p in results.fingerprints(report_stage.STEP, layout))
    bench = [f"bench/{p.name}" for p in layout.bench.files().values()]
    assert named == sorted(
        [
            "ingest_summary.json",
            *(f"shape/{p.name}" for p in layout.shape.files().values()),
            *(f"prefix/{p.name}" for p in layout.prefix.files().values()),
            "simulation/scenarios.json",
            "simulation/scenarios.parquet",
            "simulation/curves.parquet",
            *(name for name in bench if name != "bench/per_request.parquet"),
            "capacity/capacity.json",
        ]
    )


def test_every_section_a_stage_takes_is_watched() -> None:
    """Dagster observes each configuration section some step takes, so a changed section makes
    the steps that take it stale; every section of the file is taken by one."""
    assert set(config_module._File.model_fields) == set(SECTIONS)
    assert CONFIG_SECTIONS == SECTIONS
    taken = {name for step in STEPS for name in step.sections}
    assert taken <= set(SECTIONS)
    by_asset = {step.asset: set(step.sections) for step in STEPS}
    assert {"decision", "requirements"} <= by_asset["engine_decision"]
    assert "whatif" in by_asset["decision_map"]


def test_the_ledger_finds_the_bundled_catalog_in_the_installation() -> None:
    assert (INSTALLATION / "pipeline" / "decision" / "engines.yaml").is_file()
