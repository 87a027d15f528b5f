"""`enginefit decide` and `enginefit explain` as a user meets them on the bundled sample."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.cli import main as enginefit
from tests.conftest import bundled_config


def test_decide_runs_the_missing_stages_then_prints_the_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = bundled_config(tmp_path, "q1")
    assert enginefit(["decide", "--config", str(config), "--json"]) == 0
    out, err = capsys.readouterr()
    assert "ran the missing upstream stages: ingest, shape, prefix, simulation, bench" in err
    record = json.loads(out)
    assert set(record) >= {
        "schema_version",
        "recommendation",
        "candidates",
        "rationale",
        "triggers",
        "previous",
        "inputs",
    }
    assert record["schema_version"] == 1 and record["previous"] is None
    rec = record["recommendation"]
    assert {"engine", "routing_layer", "runner_up", "confidence", "headline"} <= set(rec)
    assert (rec["engine"], rec["runner_up"], rec["confidence"]) == ("vllm", "sglang", "provisional")
    candidate = record["candidates"][0]
    assert {
        "engine",
        "status",
        "reasons",
        "cost_per_1m_output_usd",
        "monthly_cost_usd",
        "payback_months",
    } <= set(candidate)
    assert {"rule", "title", "source", "fired", "evidence", "effect"} == set(record["rationale"][0])
    assert {"id", "metric", "comparator", "threshold", "value", "why", "status"} == set(
        record["triggers"][0]
    )
    workload = tmp_path / "q1" / "data" / "mooncake-conversation"
    assert "shape/workload_shape.json" in record["inputs"]
    # The bundled H100 sweep costs $3 ÷ (92.2241 req/s × 62.3254 tokens × 3600) × 10⁶ per 1M
    # output tokens (tests/test_bench_cost.py).
    assert candidate["cost_per_1m_output_usd"] == pytest.approx(
        3 / (92.2241 * 62.3254 * 3600) * 1e6, rel=1e-5
    )

    # The next quarter checks the first quarter's triggers; explain reads both back.
    first = workload / "decision" / "decision.json"
    kept = tmp_path / "q1-decision.json"
    kept.write_bytes(first.read_bytes())
    assert enginefit(["decide", "--config", str(config), "--previous", str(kept)]) == 0
    out, _ = capsys.readouterr()
    assert out.splitlines()[0].startswith("vLLM: $0.1450 per 1M output tokens at the SLO")
    assert enginefit(["explain", str(first)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Engine decision for workload mooncake-conversation (as of 2026-11-29)")
    assert "Previous decision (2026-11-29: vllm), its triggers now" in text
    assert "bench.stale[vllm]: bench.age_days[vllm] > 183: was 389, now 389 → fired" in text


def test_a_previous_record_that_is_not_one_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bogus = tmp_path / "decision.json"
    bogus.write_text(json.dumps({"schema_version": 1, "workload": "w"}))
    assert enginefit(["explain", str(bogus)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"enginefit: error: {bogus}: ") and err.count("\n") == 1
    bogus.write_text(json.dumps({"schema_version": 7}))
    assert enginefit(["explain", str(bogus)]) == 2
    assert "schema_version 7 is not 1" in capsys.readouterr().err
