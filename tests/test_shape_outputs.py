"""Charts (byte-identical SVGs), the `workload_shape` asset and checks, and `enginefit shape`."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from assets.resources import EnginefitStore
from assets.shape import CHECKS, workload_shape
from pipeline.cli import main as enginefit
from pipeline.layout import WorkloadLayout
from pipeline.schema import conform
from pipeline.shape import checks, stage
from pipeline.shape.compute import compute_shape
from pipeline.shape.lengths import cdf_points
from pipeline.shape.present import figures
from pipeline.shape.result import ShapeResult
from pipeline.unknown import Unknown
from tests.conftest import DEFAULTS, shared_path, write_config, write_requests

T0 = datetime(2024, 3, 1, 12, tzinfo=UTC)


def small_trace(n: int = 300) -> pl.DataFrame:
    return conform(
        pl.DataFrame(
            {
                "request_id": [f"r{i}" for i in range(n)],
                "arrival": [T0 + timedelta(milliseconds=(i * 7919) % 600_000) for i in range(n)],
                "prompt_tokens": [(i * 37) % 3000 + 1 for i in range(n)],
                "output_tokens": [(i * 13) % 400 for i in range(n)],
                "session_id": [f"s{i % 20}" for i in range(n)],
                "tenant": [f"t{i % 3}" for i in range(n)],
                "model": ["m-small" if i % 4 else "m-large" for i in range(n)],
            }
        )
    ).sort("arrival")


def test_cdf_points_exact_and_thinned() -> None:
    df = pl.DataFrame({"x": [3, 1, 2, 2, None]})
    pts = cdf_points(df, "x")
    assert pts.rows() == [(1, 0.25), (2, 0.75), (3, 1.0)]
    big = pl.DataFrame({"x": list(range(10_000))})
    thin = cdf_points(big, "x", max_points=100)
    assert thin.height <= 101 and thin["share"][-1] == 1.0 and thin["value"][-1] == 9_999
    # every kept point is exact: share = (value + 1) / n
    assert (thin["share"] - (thin["value"] + 1) / 10_000).abs().max() < 1e-12  # type: ignore[operator]


def test_charts_are_byte_identical_and_undated() -> None:
    df = small_trace()
    results = [compute_shape(df, DEFAULTS.shape) for _ in range(2)]
    first, second = (figures(r, r.plots) for r in results if r.plots is not None)
    assert set(first) == {"lengths_svg", "arrivals_svg", "concurrency_svg"}
    for name, svg in first.items():
        assert svg == second[name], name
        assert svg.startswith(b"<?xml") and b"<dc:date>" not in svg
    # text is kept as text (one element per line), not a path per glyph
    assert b">Concurrency over time (ESTIMATED)</text>" in first["concurrency_svg"]
    assert b"DejaVuSans-" not in first["concurrency_svg"]  # no glyph outlines


def test_checks_predicates() -> None:
    shape = compute_shape(small_trace(), DEFAULTS.shape).metrics
    assert checks.estimates_labelled(shape) == []
    assert checks.unsupported_have_reasons(shape) == []
    unlabelled = shape.concurrency.model_copy(update={"latency_model": None, "label": "exact"})
    assert checks.estimates_labelled(shape.model_copy(update={"concurrency": unlabelled})) == [
        "estimated concurrency lacks its latency model",
        "estimated concurrency is labelled 'exact'",
    ]
    windows = {**shape.arrivals.windows, "1s": Unknown(reason=" ")}
    arrivals = shape.arrivals.model_copy(update={"windows": windows})
    assert checks.unsupported_have_reasons(shape.model_copy(update={"arrivals": arrivals})) == [
        "window 1s: unsupported without a reason"
    ]


def test_result_round_trips_through_its_files(tmp_path: Path) -> None:
    """What the stage writes reads back as the same result (metrics, facts, findings)."""
    result = compute_shape(small_trace(), DEFAULTS.shape)
    layout = WorkloadLayout(tmp_path / "w")
    stage.write(result, layout)
    back = stage.read_result(layout)
    assert back.to_json() == json.loads(json.dumps(result.to_json()))
    assert back.facts == result.facts and back.findings == result.findings
    assert back.concurrency_series.equals(result.concurrency_series)
    assert ShapeResult.from_json(result.to_json()).facts == result.facts


def test_workload_shape_asset(tmp_path: Path) -> None:
    config = write_config(tmp_path, ["unused.csv"])
    store = EnginefitStore(config_path=str(config))
    write_requests(small_trace(), store.layout().root)
    result = dg.materialize([workload_shape, *CHECKS], resources={"store": store})
    assert result.success
    out = store.layout().shape.dir
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        ".workload_shape.sha256.json",  # the seal the next stage checks
        "arrivals.svg",
        "concurrency.parquet",
        "concurrency.svg",
        "lengths_cdf.svg",
        "workload_facts.json",
        "workload_shape.json",
    ]
    shape = json.loads((out / "workload_shape.json").read_text())
    assert shape["requests"] == 300 and shape["sessions"]["sessions"] == 20
    assert shape["tenants"]["distinct"] == 3
    facts = json.loads((out / "workload_facts.json").read_text())
    assert facts["requests"] == 300 and facts["models"] == ["m-large", "m-small"]
    assert facts["peak_concurrency_estimated"] is True and facts["tenants"] == 3
    conc = pl.read_parquet(out / "concurrency.parquet")
    assert conc["concurrency_max"].max() == shape["concurrency"]["peak"]
    checks = result.get_asset_check_evaluations()
    assert len(checks) == 2 and all(c.passed for c in checks)
    md = result.asset_materializations_for_node("workload_shape")[0].metadata
    assert "findings_table" in md and "summary_path" in md
    # Re-materialising gives byte-identical files.
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert dg.materialize([workload_shape], resources={"store": store}).success
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_asset_rejects_bad_shape_config(tmp_path: Path) -> None:
    config = write_config(tmp_path, ["unused.csv"])
    config.write_text(config.read_text() + "shape:\n  long_tail_ratio: 0.5\n")
    store = EnginefitStore(config_path=str(config))
    write_requests(small_trace(10), tmp_path / "data" / "t")
    result = dg.materialize([workload_shape], resources={"store": store}, raise_on_error=False)
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data.error
    assert failure is not None and failure.cause is not None
    assert "shape.long_tail_ratio: Input should be greater than 1 (got 0.5)" in (
        failure.cause.message
    )


def test_cli_on_canonical_parquet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_requests(small_trace(), tmp_path / "w")
    assert enginefit(["shape", str(tmp_path / "w"), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["shape"]["requests"] == 300 and payload["facts"]["requests"] == 300
    assert enginefit(["shape", str(tmp_path / "w")]) == 0
    text = capsys.readouterr().out
    assert "## findings" in text and "concurrency." in text


def test_cli_config_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_requests(small_trace(), tmp_path / "w")
    config = write_config(tmp_path, ["unused.csv"])
    config.write_text(config.read_text() + "shape:\n  latency_model: {tpot_ms: 1}\n")
    assert enginefit(["shape", str(tmp_path / "w"), "--json", "--config", str(config)]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["shape"]["concurrency"]["latency_model"]["tpot_ms"] == 1.0
    config.write_text(config.read_text() + "  bogus: 1\n")
    assert enginefit(["shape", str(tmp_path / "w"), "--config", str(config)]) == 2
    assert "unknown key shape.bogus" in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.shared
def test_cli_on_raw_azure_trace(capsys: pytest.CaptureFixture[str]) -> None:
    path = shared_path("traces", "azure-llm-2023", "AzureLLMInferenceTrace_code.csv")
    assert enginefit(["shape", str(path), "--json"]) == 0
    shape = json.loads(capsys.readouterr().out)["shape"]
    assert shape["requests"] == 8_819
    assert shape["arrivals"]["windows"]["1s"]["peak_count"] == 67
    assert shape["lengths"]["prompt_tokens"]["p50"] == 1_469


@pytest.mark.shared
def test_cli_on_tracelab_sessions(capsys: pytest.CaptureFixture[str]) -> None:
    path = shared_path("traces", "tracelab-examples", "sanitized", "round_trace.jsonl")
    assert enginefit(["shape", str(path), "--json"]) == 0
    shape = json.loads(capsys.readouterr().out)["shape"]
    s = shape["sessions"]
    assert s["known"] and s["sessions"] == 2 and s["rows_with_session"] == 19
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    expected = sum(r["prefix_tokens"] for r in rows) / sum(r["input_tokens_total"] for r in rows)
    assert shape["provider_cache"]["cached_share"] == pytest.approx(expected)
    # TraceLab rounds log their timing, so the sweep is exact: two sessions months apart, one
    # round at a time.
    assert shape["concurrency"]["peak"] == 1


@pytest.mark.parametrize(
    "e2e_ms",
    [[None], [0.0], [5.0, 0.0, 7.0]],
    ids=["single-estimated", "single-zero-length", "same-instant"],
)
def test_degenerate_traces_still_produce_every_output(
    tmp_path: Path, e2e_ms: list[float | None]
) -> None:
    n = len(e2e_ms)
    df = conform(
        pl.DataFrame(
            {
                "arrival": [T0] * n,
                "prompt_tokens": [0] * n,
                "output_tokens": [0] * n,
                "e2e_ms": pl.Series(e2e_ms, dtype=pl.Float64),
            }
        )
    )
    layout = WorkloadLayout(tmp_path)
    written = stage.write(compute_shape(df.lazy(), DEFAULTS.shape), layout)
    assert sorted(written) == sorted(layout.shape.files())
    assert all(p.exists() for p in written.values())
    shape = json.loads(layout.shape.summary.read_text())
    assert shape["requests"] == n and shape["arrivals"]["mean_rate_rps"] is None
    assert not shape["arrivals"]["inter_arrival"]["supported"]
    assert shape["lengths"]["output_tokens"]["p99_over_p50"] == 0.0  # 0/0 tail: no tail
    expected_peak = sum(1 for d in e2e_ms if d is None or d > 0)
    assert shape["concurrency"]["peak"] == expected_peak
    facts = json.loads(layout.shape.facts.read_text())
    assert facts["mean_rate_rps"] is None and facts["span_s"] == 0.0
