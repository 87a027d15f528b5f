"""`make report`'s job: the whole asset graph on the bundled sample, end to end."""

from __future__ import annotations

import hashlib
from pathlib import Path

import dagster as dg

from assets.definitions import run_full_graph
from tests.conftest import bundled_config


def _digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_full_graph_on_the_bundled_sample_is_complete_and_deterministic(tmp_path: Path) -> None:
    """Every asset materialises, every check runs, and a second run writes identical bytes."""
    runs = []
    for name in ("a", "b"):
        with dg.DagsterInstance.ephemeral() as instance:
            outputs, success = run_full_graph(bundled_config(tmp_path, name), instance)
        assert success
        runs.append(_digests(tmp_path / name / "data"))
        produced = {asset for asset, _, _ in outputs}
    assert {
        "workload",
        "workload_shape",
        "prefix_sharing",
        "simulation_curves",
        "simulation_plots",
        "bench_analysis",
        "concurrency_by_engine",
    } <= produced
    assert runs[0] == runs[1]
    assert "mooncake-conversation/bench/slo_capacity.parquet" in runs[0]
