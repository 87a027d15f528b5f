"""`make report`'s job: the whole asset graph on the bundled sample, end to end."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from assets.cli import main
from assets.definitions import GraphRun
from pipeline.ledger import ReportTree, chain_head
from tests.conftest import bundled_config, bundled_report_output


def test_full_graph_on_the_bundled_sample_is_complete(
    bundled_graph_run: tuple[GraphRun, Path],
) -> None:
    """`enginefit report` on the bundled sample, from an empty folder with no DAGSTER_HOME (the
    shared run): every asset materialises, every check runs, and the command ends with the
    summary. (That every stage's command writes the bytes its asset writes is
    tests/test_stage_identity.py.)"""
    run, graph_data = bundled_graph_run
    assert run.success, run.failures
    assert {
        "workload",
        "workload_shape",
        "prefix_sharing",
        "simulation_curves",
        "simulation_plots",
        "bench_analysis",
        "concurrency_by_engine",
        "workload_capacity",
        "engine_decision",
        "revisit_triggers",
        "decision_map",
        "engine_selection_report",
    } <= {asset for asset, _, _ in run.outputs}
    assert (run.checks_passed, run.checks_failed) == (18, [])
    assert (graph_data / "mooncake-conversation/bench/slo_capacity.parquet").is_file()

    code, out, err = bundled_report_output(graph_data)
    assert code == 0
    assert "enginefit report: workload done (" in err
    # Before the first ingest the trace's bytes size the run: 3,029,533 ÷ 11 bytes a block,
    # far within four times the flattening limit, so one process.
    assert (
        "enginefit report: executor in_process (auto: the trace files (2.9 MiB) may hold "
        "275,412 stored blocks, at most 4 × simulation.curve_exact_max_blocks (400,000,000); "
        "--executor sets it)"
    ) in err.splitlines()
    assert "enginefit report: simulation_plots done (" in err
    assert "Traceback" not in out + err
    summary = out[out.index("summary:") :].splitlines()
    # Published figures: 12,031 requests in the Mooncake conversation trace (SOURCE.md); the H100
    # sweep's capacity and cost at the default SLO (tests/test_bench_cost.py works them by hand).
    assert summary[1].startswith(
        "  ingest      12,031 requests ingested of 12,031 read, 0 quarantined"
    )
    assert summary[5] == (
        "  bench       vllm 0.11.0 / meta-llama/Llama-3.1-8B-Instruct / bf16 / 1×H100-80GB / "
        "shared-prefix-synthetic: capacity 92.19 req/s, $0.1450 per 1M output tokens (lower_bound)"
    )
    # At the bundled SLO (p95 TTFT 6 s, p99 TPOT 175 ms) every kept-up point of the sweep passes,
    # so its capacity is a lower bound; carried to Mooncake's prompts (p95 ~40k tokens) and its
    # bursts one H100 serves 0.23 req/s, and the 4.12 req/s peak needs ceil(4.117 ÷ (0.231 ×
    # 0.8)) = 23 of them: 23 × $3 × 730 h = $50,370 a month.
    assert summary[6].startswith(
        "  capacity    vllm 0.11.0 / meta-llama/Llama-3.1-8B-Instruct / 1×H100-80GB: 0.23 req/s "
        "per replica at this mix (transferred), 23 replica(s) at peak, $50,370/month, "
    )
    assert summary[7].startswith("  decision    vLLM: $10.5088 per 1M output tokens at the SLO")
    root = graph_data.parents[1]
    pdf = (
        root
        / "asset"
        / "reports"
        / "mooncake-conversation"
        / "2025-Q1"
        / "v1"
        / "engine-selection.pdf"
    )
    assert summary[8] == f"  report      2025-Q1 v1: {pdf}"
    assert summary[9] == "checks: 18 passed, 0 did not"
    # `make report` ends with the document's path.
    assert out.splitlines()[-1] == f"PDF: {pdf}" and pdf.read_bytes().startswith(b"%PDF")
    # ... after the ledger's chain head, to keep elsewhere (docs/audit.md).
    head = chain_head(ReportTree(pdf.parents[2]).read_ledger())
    assert out.splitlines()[-2].startswith(f"ledger chain head: {head} (keep a copy elsewhere")
    # Dagster's history lives beside the configuration, not in the folder the command ran from.
    assert (root / ".dagster_home" / "history" / "runs.db").is_file()
    assert list((root / "elsewhere").iterdir()) == []


def test_report_command_refuses_a_bad_configuration_before_starting_dagster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("workload:\n  name: x\n  hash_salt: s\n  traces: [t.jsonl]\n  colour: red\n")
    assert main(["report", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "workload.colour" in err and str(bad) in err
    assert not (tmp_path / "home").exists()


def test_report_command_names_the_failed_step_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stage that raises is one line naming the step and the input, exit 2, no traceback."""
    config = bundled_config(tmp_path, "missing")
    raw = yaml.safe_load(config.read_text())
    raw["workload"]["traces"] = [{"path": str(tmp_path / "gone.jsonl"), "format": "auto"}]
    config.write_text(yaml.safe_dump(raw))
    assert main(["report", "--config", str(config)]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    failures = [line for line in err.splitlines() if line.startswith("enginefit: error:")]
    # The workload reads each trace file in a step of its own (assets/ingest.py).
    assert failures == [
        "enginefit: error: step workload.ingest_file[000_gone_jsonl] failed: "
        f"{tmp_path / 'gone.jsonl'}: file not found"
    ]
