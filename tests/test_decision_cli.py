"""`enginefit decide` and `enginefit explain` as a user meets them on the bundled sample."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from assets.cli import main as enginefit
from assets.definitions import GraphRun
from tests.conftest import REPO, bundled_config
from tests.decision_fixtures import no_figures


def _digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_decide_runs_the_missing_stages_then_prints_the_record(
    bundled_graph_run: tuple[GraphRun, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a fresh folder decide has Dagster materialise every stage the decision reads, then
    writes the record: every file it wrote is the one the whole graph writes (the decision's
    too: the command and the engine_decision asset are one code path)."""
    run, graph_data = bundled_graph_run
    assert run.success, run.failures
    config = bundled_config(tmp_path, "q1")
    assert enginefit(["decide", "--config", str(config), "--json"]) == 0
    out, err = capsys.readouterr()
    by_decide = _digests(tmp_path / "q1" / "data")
    by_graph = _digests(graph_data)
    assert {name: by_graph.get(name) for name in by_decide} == by_decide
    # The 44 files of the stages before it (tests/test_stage_identity.py) but the simulation's 2
    # figures (simulation_plots is no input of the decision), its own 4, the 10 seals beside
    # them, and the workload folder's marker and lock.
    assert len(by_decide) == 58
    decision = {n for n in by_decide if "/decision/" in n and not n.endswith(".sha256.json")}
    assert len(decision) == 4
    ran = err.split("materialised what was missing or stale: ")[1].split("\n")[0].split(", ")
    assert set(ran) == {
        "bench_load_points",
        "workload",
        "prefix_sharing",
        "simulation_curves",
        "simulation_scenarios",
        "workload_shape",
        "bench_analysis",
        "concurrency_by_engine",
        "workload_capacity",
    }
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
    assert record["schema_version"] == 3 and record["previous"] is None
    rec = record["recommendation"]
    assert {"engine", "routing_layer", "runner_up", "confidence", "headline"} <= set(rec)
    # vLLM is the one engine with a cost at the bundled SLO (its sweep carried to this
    # workload's prompts, provisionally); the decision tree's own choice for prefix-heavy traffic,
    # SGLang, has no benchmark, so it is the runner-up.
    assert (rec["engine"], rec["runner_up"], rec["confidence"]) == ("vllm", "sglang", "provisional")
    assert rec["headline"].startswith("vLLM: $10.5088 per 1M output tokens at the SLO")
    candidate = record["candidates"][0]
    assert {
        "engine",
        "status",
        "reasons",
        "cost_per_1m_output_usd",
        "monthly_cost_usd",
        "payback",
    } <= set(candidate)
    assert {"rule", "title", "source", "fired", "evidence", "effect"} == set(record["rationale"][0])
    assert {"id", "metric", "comparator", "threshold", "value", "why", "status"} == set(
        record["triggers"][0]
    )
    # The fleet is sized (23 replicas), so routing is judged at the simulated count nearest it.
    assert "the simulated count nearest the fleet's 23" in record["routing"]["reason"]
    vllm = next(c for c in record["candidates"] if c["engine"] == "vllm")
    # ceil(4.117 req/s peak ÷ (0.231 req/s × 0.8 headroom)) = 23 H100s × $3 × 730 h.
    assert vllm["monthly_cost_usd"] == 23 * 3.0 * 730
    assert vllm["cost_per_1m_output_usd"] == pytest.approx(10.5088, abs=5e-5)
    assert vllm["cost_note"].startswith("far outside the measured mix")
    # Said once among the confidence reasons, not once by the ranking and again per engine.
    assert sum(vllm["cost_note"] in r for r in rec["confidence_reasons"]) == 1
    assert vllm["benchmark_monthly_cost_usd"] == 2190.0  # 1 GPU × $3 × 730 h
    workload = tmp_path / "q1" / "data" / "mooncake-conversation"
    assert "shape/workload_shape.json" in record["inputs"]
    # The bundled H100 sweep costs $3 ÷ (92.2241 req/s × 62.3254 tokens × 3600) × 10⁶ per 1M
    # output tokens (tests/test_bench_cost.py): the benchmark's own figure, kept beside.
    assert vllm["benchmark_cost_per_1m_output_usd"] == pytest.approx(
        3 / (92.2241 * 62.3254 * 3600) * 1e6, rel=1e-5
    )

    # The next quarter checks the first quarter's triggers; explain reads both back.
    first = workload / "decision" / "decision.json"
    kept = tmp_path / "q1-decision.json"
    kept.write_bytes(first.read_bytes())
    assert enginefit(["decide", "--config", str(config), "--previous", str(kept)]) == 0
    out, _ = capsys.readouterr()
    assert out.splitlines()[0].startswith("vLLM: $10.5088 per 1M output tokens at the SLO")
    assert enginefit(["explain", str(first)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Engine decision for workload mooncake-conversation (as of 2026-11-29)")
    assert "The previous decision (2026-11-29: vLLM), its triggers now" in text
    # Each trigger of the first quarter's answer is evaluated again, with both values.
    assert (
        "- Revisit if vLLM's status in the catalog is no longer active; today active. It was "
        "active then: did not fire." in " ".join(text.split())  # lines wrap at 96 characters
    )


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
    assert "schema_version 7 is not one of 1, 2, 3" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--as-of", "2025-02-30"], "--as-of: '2025-02-30' is not an ISO date"),
        (["--previous", "missing-decision.json"], "missing-decision.json"),
    ],
)
def test_a_wrong_decide_flag_fails_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], needle: str
) -> None:
    config = bundled_config(tmp_path, "f")
    assert enginefit(["decide", "--config", str(config), *flags]) == 2
    err = capsys.readouterr().err
    said, error = err.splitlines()
    assert said.startswith("enginefit decide: configuration: ")
    assert error.startswith("enginefit: error: ") and needle in error
    assert not (tmp_path / "f" / "data").exists()  # nothing was materialised


UPSTREAM = {
    "workload",
    "workload_shape",
    "prefix_sharing",
    "simulation_scenarios",
    "simulation_curves",
    "bench_load_points",
    "bench_analysis",
    "concurrency_by_engine",
    "workload_capacity",
}
# The benchmark's files and prices: read by the bench assets and the capacity stage.
BENCH = {"bench_load_points", "bench_analysis", "concurrency_by_engine", "workload_capacity"}


def _decide(config: Path, capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], set[str]]:
    """The record ``decide --json`` prints and the assets it had Dagster materialise first."""
    assert enginefit(["decide", "--config", str(config), "--json"]) == 0
    out, err = capsys.readouterr()
    _, said, ran = err.partition("materialised what was missing or stale: ")
    return json.loads(out), set(ran.split("\n")[0].split(", ")) if said else set()


@pytest.fixture
def _without_figures() -> Iterator[None]:
    with no_figures():
        yield


# Which assets rerun does not depend on the figures the stages draw (most of each run's time).
@pytest.mark.usefixtures("_without_figures")
def test_decide_reruns_what_a_changed_input_invalidates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fresh folder: the whole upstream runs once. Unchanged: nothing reruns. A doubled H100
    price or a rewritten benchmark file: only the bench assets rerun. A new shape setting: the
    shape and what reads it, never the ingest or the prefix analysis. A deleted output: its
    asset and what follows. A rewritten trace: everything but the benchmark files' reading."""
    # The first 300 requests of the sample: which assets rerun depends on what changed, not on how
    # much traffic there is, and each of the eight runs reads all of it.
    trace = tmp_path / "trace.jsonl"
    lines = (REPO / "traces" / "mooncake" / "conversation_trace.jsonl").read_text().splitlines()
    trace.write_text("\n".join(lines[:300]) + "\n")
    results = tmp_path / "bench-results"
    shutil.copytree(REPO / "bench-results", results)
    config = bundled_config(tmp_path, "w")
    raw = yaml.safe_load(config.read_text())
    raw["workload"]["traces"] = [{"path": str(trace), "format": "auto"}]
    raw["bench"]["results"] = [str(results)]
    config.write_text(yaml.safe_dump(raw))

    first, ran = _decide(config, capsys)
    assert ran == UPSTREAM
    again, ran = _decide(config, capsys)
    assert ran == set() and again == first

    raw["bench"]["prices"]["gpu_hour_usd"]["H100"] = 6.0
    config.write_text(yaml.safe_dump(raw))
    record, ran = _decide(config, capsys)
    assert ran == BENCH
    # The benchmark's own cost doubles; this workload's stays unknown (the SLO is out of reach).
    cost = {c["engine"]: c["benchmark_cost_per_1m_output_usd"] for c in record["candidates"]}
    before = {c["engine"]: c["benchmark_cost_per_1m_output_usd"] for c in first["candidates"]}
    assert cost["vllm"] == pytest.approx(2 * before["vllm"], rel=1e-5)

    # The replica's KV size is the capacity stage's input alone.
    raw["requirements"]["kv_cache"]["memory_utilization"] = 0.9
    config.write_text(yaml.safe_dump(raw))
    assert _decide(config, capsys)[1] == {"workload_capacity"}

    summary = results / "vllm-h100-inference-perf" / "summary_lifecycle_metrics.json"
    summary.write_bytes(summary.read_bytes() + b"\n")
    assert _decide(config, capsys)[1] == BENCH

    raw["shape"] = {**raw.get("shape", {}), "long_tail_ratio": 5.0}
    config.write_text(yaml.safe_dump(raw))
    ran = _decide(config, capsys)[1]
    assert {
        "workload_shape",
        "simulation_curves",
        "bench_analysis",
        "concurrency_by_engine",
        "workload_capacity",
    } <= ran
    assert not {"workload", "prefix_sharing", "bench_load_points"} & ran

    (tmp_path / "w" / "data" / "mooncake-conversation" / "bench" / "bench_analysis.json").unlink()
    assert _decide(config, capsys)[1] == {
        "bench_analysis",
        "concurrency_by_engine",
        "workload_capacity",
    }

    trace.write_bytes(trace.read_bytes() + b"\n")
    assert _decide(config, capsys)[1] == UPSTREAM - {"bench_load_points"}
