"""The bench assets materialise with and without configured results."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from assets.bench import ASSETS, CHECKS
from assets.resources import EnginefitStore
from assets.shape import workload_shape
from pipeline.bench.stage import NO_RESULTS
from tests.conftest import write_requests
from tests.workloads import peaky_sharing_trace

# The Apache-2.0 sweep is committed (tests/data/bench/NOTICE), so these tests always run.
H100 = (
    Path(__file__).resolve().parent
    / "data"
    / "bench"
    / "inference-perf"
    / "kubecon-na-2025-vllm-h100"
)


def write_config(tmp_path: Path, bench: str = "") -> Path:
    config = tmp_path / "enginefit.yaml"
    config.write_text(
        "workload: {name: t, traces: [some/file], block_size: 16, hash_salt: test-salt}\n"
        f"paths: {{data_dir: {tmp_path / 'data'}, reports_dir: {tmp_path / 'reports'}}}\n" + bench
    )
    return config


def materialize(config: Path) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [*ASSETS, *CHECKS],
        resources={"store": EnginefitStore(config_path=str(config))},
        raise_on_error=True,
    )


def metadata(result: dg.ExecuteInProcessResult, key: str) -> dict[str, object]:
    events = [
        e for e in result.get_asset_materialization_events() if e.asset_key == dg.AssetKey(key)
    ]
    assert len(events) == 1
    return {k: v.value for k, v in events[0].materialization.metadata.items()}


def test_no_bench_results_configured(tmp_path: Path) -> None:
    result = materialize(write_config(tmp_path))
    assert result.success
    assert metadata(result, "bench_load_points")["status"] == NO_RESULTS
    analysis = metadata(result, "bench_analysis")
    assert analysis["dagster/row_count"] == 0
    assert NO_RESULTS in str(analysis["notes"])
    out = tmp_path / "data" / "t" / "bench"
    assert pl.read_parquet(out / "load_points.parquet").height == 0
    assert pl.read_parquet(out / "slo_capacity.parquet").height == 0
    assert (out / "latency_vs_load.svg").read_bytes().startswith(b"<?xml")
    checks = result.get_asset_check_evaluations()
    assert len(checks) == 2 and all(c.passed for c in checks)


@pytest.mark.shared
def test_h100_results_with_workload_facts(tmp_path: Path) -> None:
    if not H100.is_dir():
        pytest.skip("shared bench samples not available")
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text("engine: vllm\ngpu_type: H100\ngpu_count: 1\nrun_date: 2025-11-05\n")
    # The real upstream stages on a trace of known shape: 60 s peak 150 req/s, prompt p99/p50
    # 6,400/800 = 8, no prefix stage run (so prefix sharing is unknown, and said so).
    write_requests(peaky_sharing_trace(), tmp_path / "data" / "t")
    config = write_config(
        tmp_path,
        f"bench:\n  results: [{H100}]\n  manifest: {manifest}\n"
        "  prices: {gpu_hour_usd: {H100: 3.0}}\n  as_of: 2026-11-29\n",
    )
    store = EnginefitStore(config_path=str(config))
    assert dg.materialize([workload_shape], resources={"store": store}).success
    result = materialize(config)
    assert metadata(result, "bench_load_points")["dagster/row_count"] == 7
    cap_meta = metadata(result, "bench_analysis")
    assert cap_meta["as_of"] == "2026-11-29 (bench.as_of)"
    out = tmp_path / "data" / "t" / "bench"
    capacity = pl.read_parquet(out / "slo_capacity.parquet")
    assert capacity.get_column("capacity_rps").to_list() == [pytest.approx(92.19)]
    # stage 3 sustained: achieved send rate 92.2241 req/s × 62.3254 mean output tokens
    assert capacity.item(0, "cost_per_1m_output_usd") == pytest.approx(
        3.0 / (92.22409851829183 * 62.3254384378955 * 3600) * 1e6
    )
    fleet = pl.read_parquet(out / "fleet.parquet")
    assert dict(fleet.select("rate_label", "gpus").rows()) == {"mean": 1, "peak_60s": 2}
    findings = pl.read_parquet(out / "validity_findings.parquet")
    status = dict(findings.select("check", "status").rows())
    assert status["peak_rate"] == "flag"  # sustained 92.19 req/s, production peak 150 req/s
    assert status["prefix_structure"] == "unknown"  # the prefix stage did not run
    message = dict(findings.select("check", "message").rows())["prefix_structure"]
    assert "production shared-prefix ratio unknown" in message
    assert status["stale"] == "flag"  # 389 days
    assert status["fixed_length_prompts"] == "flag"  # production p99/p50 = 8 ≥ 2
    assert (out / "cost_per_1m_at_slo.svg").read_bytes().startswith(b"<?xml")
