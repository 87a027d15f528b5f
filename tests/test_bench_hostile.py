"""``enginefit bench`` against hostile input: numbers no run can produce, closed-loop
runs at concurrency 1, prompt-like keys in result files, the terminal table, workload facts and
prices in ad hoc mode, and messages in the command line's language."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline.bench.readers import read_bench_files
from pipeline.cli import main
from tests.conftest import SHARED, write_config, write_requests
from tests.test_bench_cli import run_json as bench_json
from tests.workloads import peaky_sharing_trace

SYSTEM_YAML = "engine: vllm\nengine_version: 0.11.0\ngpu_type: H100-80GB\n"
MANIFEST_YAML = SYSTEM_YAML + "gpu_count: 1\n"


def vllm_point(**changes: Any) -> dict[str, Any]:
    """A vLLM ``bench serve`` aggregate that passes the default SLO and kept up:
    200 requests at 2 req/s, p95 TTFT 80 ms, p99 ITL 15 ms, mean E2E 1.04 s, 100 output tokens
    each (sustained output 2 × 100 = 200 tok/s)."""
    record: dict[str, Any] = {
        "date": "20250601-120000",
        "backend": "vllm",
        "model_id": "m",
        "num_prompts": 200,
        "request_rate": 2.0,
        "burstiness": 1.0,
        "max_concurrency": None,
        "duration": 100.5,
        "completed": 200,
        "failed": 0,
        "total_input_tokens": 20000,
        "total_output_tokens": 20000,
        "request_throughput": 1.99,
        "output_throughput": 199.0,
        "total_token_throughput": 398.0,
        "mean_ttft_ms": 50.0,
        "median_ttft_ms": 50.0,
        "p95_ttft_ms": 80.0,
        "p99_ttft_ms": 90.0,
        "mean_itl_ms": 10.0,
        "median_itl_ms": 10.0,
        "p95_itl_ms": 12.0,
        "p99_itl_ms": 15.0,
        "mean_e2el_ms": 1040.0,
        "median_e2el_ms": 1000.0,
        "p99_e2el_ms": 1500.0,
    }
    record.update(changes)
    return record


def write_result(folder: Path, record: dict[str, Any], name: str = "run.json") -> Path:
    """``record`` as JSON (Python's json writes NaN/Infinity bare, as vLLM's client does),
    with a sidecar manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(record))
    (folder / "enginefit-bench.yaml").write_text(MANIFEST_YAML)
    return path


def with_bench_section(tmp_path: Path, bench: str) -> Path:
    """./enginefit.yaml naming workload ``t`` (data under tmp_path) with a ``bench`` section."""
    config = write_config(tmp_path, ["x.jsonl"])
    config.write_text(config.read_text() + f"bench: {bench}\n")
    return config


def bench_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one error line of a refused ``enginefit bench`` (exit 2, no traceback)."""
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith("enginefit bench: configuration:"), err
    assert err[1].startswith("enginefit: error: ")
    return err[1]


# ------------------------------------------------------------------------------- 1. numbers


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "-inf", "1e400", "1e308"])
def test_gpu_hour_usd_must_be_a_finite_price(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_result(tmp_path / "r", vllm_point())
    line = bench_error(capsys, str(path), f"--gpu-hour-usd={value}")
    shown = repr(float(value))  # 1e400 is read as inf
    assert line == (
        f"enginefit: error: --gpu-hour-usd: a price is 0 to 1000 $ per GPU-hour, got {shown}"
    )


@pytest.mark.parametrize(
    ("lines", "key", "why"),
    [
        ("gpu_count: 1\nprice_per_gpu_hour_usd: .nan", "price_per_gpu_hour_usd", "(got nan)"),
        ("gpu_count: 1\nprice_per_gpu_hour_usd: .inf", "price_per_gpu_hour_usd", "(got inf)"),
        ("gpu_count: 1\nprice_per_gpu_hour_usd: -2", "price_per_gpu_hour_usd", "(got -2)"),
        ("gpu_count: 1000000000000000000000", "gpu_count", "(got 1000000000000000000000)"),
    ],
)
def test_manifest_numbers_are_refused_naming_file_and_key(
    lines: str, key: str, why: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_result(tmp_path / "r", vllm_point())
    manifest = tmp_path / "m.yaml"
    manifest.write_text(SYSTEM_YAML + lines + "\n")
    line = bench_error(capsys, str(path), "--manifest", str(manifest))
    expected = {
        "price_per_gpu_hour_usd": "must be a price of 0 to 1000 $/GPU-hour",
        "gpu_count": "must be a whole number from 1 to 100,000",
    }[key]
    # the sidecar beside the result and the --manifest file are merged; both are named
    assert line.endswith(f"{manifest}: manifest key '{key}' {expected} {why}")


def test_baseline_point_passes_and_is_costed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    payload = bench_json(
        capsys, str(write_result(tmp_path / "r", vllm_point())), "--gpu-hour-usd", "2"
    )
    (point,) = payload["points"]
    assert point["slo_status"] == "pass"
    (cap,) = payload["capacity"]
    # 1 GPU × $2/h ÷ (2 req/s × 100 tokens × 3600 s) × 10^6 = $2.7778 per 1M output tokens
    assert cap["cost_per_1m_output_usd"] == pytest.approx(2 / (200 * 3600) * 1e6)


@pytest.mark.parametrize(
    ("field", "value", "column", "shown", "label"),
    [
        ("p99_itl_ms", -5.0, "itl_p99_ms", "-5.0 is negative", "p99 ITL (per-gap)"),
        ("p99_itl_ms", math.nan, "itl_p99_ms", "NaN is not a number", "p99 ITL (per-gap)"),
        ("p99_itl_ms", math.inf, "itl_p99_ms", "inf is infinite", "p99 ITL (per-gap)"),
        ("p95_ttft_ms", -80.0, "ttft_p95_ms", "-80.0 is negative", "p95 TTFT"),
    ],
)
def test_impossible_latency_is_unknown_with_file_and_field(
    field: str,
    value: float,
    column: str,
    shown: str,
    label: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = write_result(tmp_path / "r", vllm_point(**{field: value}))
    payload = bench_json(capsys, str(path), "--gpu-hour-usd", "2")
    (point,) = payload["points"]
    assert point["slo_status"] == "unknown"  # never a pass
    assert f"{label} unknown: {column} = {shown} in {path}" in point["slo_reason"]
    assert point[column] is None
    assert point["rejected_values"] == [f"{column} = {shown}"]
    (cap,) = payload["capacity"]
    assert cap["capacity_rps"] is None and cap["cost_per_1m_output_usd"] is None
    assert f"vllm_bench_serve:{path}#0: {column} = {shown}: not a possible measurement" in (
        " ".join(payload["notes"])
    )


def test_nan_outside_the_slo_is_missing_not_impossible(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A NaN is a value the tool did not measure: dropped and listed, but the point is judged."""
    path = write_result(tmp_path / "r", vllm_point(mean_ttft_ms=math.nan))
    (point,) = bench_json(capsys, str(path))["points"]
    assert point["slo_status"] == "pass"
    assert point["rejected_values"] == ["ttft_mean_ms = NaN is not a number"]


def test_impossible_throughput_never_passes_nor_feeds_the_cost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_result(
        tmp_path / "b", vllm_point(output_throughput=-199.0, total_output_tokens=-20000)
    )
    payload = bench_json(capsys, str(path), "--gpu-hour-usd", "2")
    (point,) = payload["points"]
    assert point["slo_status"] == "unknown"  # its latencies pass, but the record is not trusted
    assert point["slo_reason"] == (
        f"not judged: impossible value(s) in {path}: total_output_tokens = -20000 is negative; "
        "output_tokens_per_s = -199.0 is negative"
    )
    (cap,) = payload["capacity"]
    assert cap["cost_per_1m_output_usd"] is None and cap["whole_run_output_tps"] is None
    assert any(
        "total_output_tokens = -20000 is negative; output_tokens_per_s = -199.0 is negative" in note
        for note in payload["notes"]
    )


def test_no_silent_pass_catches_a_forged_pass_with_an_impossible_value(tmp_path: Path) -> None:
    from pipeline.bench.checks import no_silent_pass
    from pipeline.bench.slo import evaluate_slo
    from tests.conftest import DEFAULTS

    path = write_result(tmp_path / "r", vllm_point(output_throughput=-199.0))
    evaluated = evaluate_slo(read_bench_files([path]).load_points, DEFAULTS.bench)
    assert evaluated.item(0, "slo_status") == "unknown"
    forged = evaluated.with_columns(slo_status=pl.lit("pass"))
    assert no_silent_pass(forged, DEFAULTS.bench) == [
        "1 of 1 passing points have a missing or broken limit, too few requests for a "
        "percentile, an open-loop server not shown to keep up, or an impossible value"
    ]
    clean = write_result(tmp_path / "c", vllm_point())
    ok = evaluate_slo(read_bench_files([clean]).load_points, DEFAULTS.bench)
    assert ok.item(0, "slo_status") == "pass" and no_silent_pass(ok, DEFAULTS.bench) == []


def test_count_beyond_int64_is_one_line_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_result(tmp_path / "r", vllm_point(completed=10**21))
    line = bench_error(capsys, str(path))
    assert line == (
        f"enginefit: error: {path}: record 0: field 'completed': 1e+21 is out of range for a count"
    )


# ------------------------------------------------------------- 2. closed loop at concurrency 1


def aiperf_concurrency_one(**loadgen: Any) -> dict[str, Any]:
    """An aiperf ``profile_export_aiperf.json`` as aiperf 0.1–0.8 write it for
    ``aiperf profile --concurrency 1`` (layout of the databloom/aiperf-lab-tests run and of
    aiperf's own documentation; numbers ours): ``loadgen`` records ``concurrency_burst``."""
    block = {"unit": "ms", "avg": 240.0, "p50": 239.0, "p90": 260.0, "p95": 270.0, "p99": 290.0}
    return {
        "schema_version": "1.0",
        "aiperf_version": "0.8.0",
        "request_throughput": {"unit": "requests/sec", "avg": 1.5},
        "request_latency": {**block, "avg": 650.0},
        "request_count": {"unit": "requests", "avg": 120.0},
        "error_request_count": {"unit": "requests", "avg": 0.0},
        "time_to_first_token": block,
        "inter_token_latency": {"unit": "ms", "avg": 20.0, "p50": 20.0, "p99": 24.0},
        "inter_chunk_latency": {"unit": "ms", "avg": 20.5, "p50": 20.4, "p99": 23.0},
        "output_token_throughput": {"unit": "tokens/sec", "avg": 30.0},
        "output_sequence_length": {"unit": "tokens", "avg": 20.0, "p50": 20.0, "p99": 20.0},
        "input_sequence_length": {"unit": "tokens", "avg": 100.0, "p50": 100.0, "p99": 100.0},
        "benchmark_duration": {"unit": "sec", "avg": 80.0},
        "input_config": {
            "endpoint": {"model_names": ["m"], "type": "chat", "streaming": True},
            "loadgen": {"concurrency": 1, "request_count": 120, **loadgen},
        },
        "was_cancelled": False,
        "error_summary": [],
        "start_time": "2026-01-31T23:07:32.596754",
        "end_time": "2026-01-31T23:08:52.804414",
    }


CLOSED_AT_ONE = (
    "1 closed-loop point(s) at concurrency 1 and no open-loop sweep: each user sends its next "
    "request only when the last one is answered, so requests never queue beyond that "
    "concurrency -- queueing and overload are hidden -- and the achieved rate is not an "
    "offered rate; reported apart, not ranked; at concurrency 1 one request is in flight at a "
    "time: its latency is the unloaded latency and says nothing about latency under load"
)


@pytest.mark.parametrize("spelling", ["request_rate_mode", "arrival_pattern"])
def test_aiperf_concurrency_one_is_closed_loop(
    spelling: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = aiperf_concurrency_one(**{spelling: "concurrency_burst"})
    path = write_result(tmp_path / "c1", record, "profile_export_aiperf.json")
    row = read_bench_files([path]).load_points.row(0, named=True)
    assert (row["load_mode"], row["arrival_process"], row["concurrency"]) == (
        "closed",
        "concurrency",
        1,
    )
    assert row["offered_rate_rps"] is None  # not +inf: it was never a burst
    payload = bench_json(capsys, str(path))
    (cap,) = payload["capacity"]
    assert cap["sweep"] == "closed" and cap["rank_pool"] is None  # apart, not ranked
    closed = next(f for f in payload["findings"] if f["check"] == "closed_loop")
    assert (closed["status"], closed["message"]) == ("flag", CLOSED_AT_ONE)


def test_aiperf_burst_without_concurrency_stays_offline(tmp_path: Path) -> None:
    record = aiperf_concurrency_one(request_rate_mode="concurrency_burst")
    del record["input_config"]["loadgen"]["concurrency"]
    path = write_result(tmp_path / "b", record, "profile_export_aiperf.json")
    row = read_bench_files([path]).load_points.row(0, named=True)
    assert (row["load_mode"], row["arrival_process"]) == ("offline", "burst")
    assert row["offered_rate_rps"] == math.inf


def test_guidellm_synchronous_sample_is_closed_loop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real Intel XPU guidellm run (synchronous only, shared samples)."""
    src = SHARED / "bench-samples" / "guidellm"
    name = "korat_intel-xpu_qwen3-30b-a3b_tp4_fp8_benchmarks_v0.5-schema1.json"
    if not (src / name).is_file():
        pytest.skip("shared bench samples not available")
    (tmp_path / "g").mkdir()
    shutil.copy(src / name, tmp_path / "g" / name)
    (tmp_path / "g" / "enginefit-bench.yaml").write_text(MANIFEST_YAML)
    payload = bench_json(capsys, str(tmp_path / "g" / name))
    assert [(p["sweep"], p["load"]) for p in payload["points"]] == [("closed", 1.0)]
    closed = next(f for f in payload["findings"] if f["check"] == "closed_loop")
    assert closed["message"] == CLOSED_AT_ONE


def test_burst_only_finding_does_not_contradict_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_result(tmp_path / "r", vllm_point(request_rate="inf"))
    payload = bench_json(capsys, str(path))
    closed = next(f for f in payload["findings"] if f["check"] == "closed_loop")
    assert (closed["status"], closed["message"]) == (
        "ok",
        "no closed-loop points; no open-loop sweep either: 1 burst / ramp / trace point(s), "
        "which have no single load to search",
    )


# ------------------------------------------------------------------------------- 6. privacy

SECRET = "Summarise the patient's record: Jane Roe, born 1970"


def written_text(folder: Path) -> str:
    """Every file under ``folder`` as text: Parquet read back (compression would hide bytes),
    everything else decoded."""
    parts = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if path.suffix == ".parquet":
            parts.append(str(pl.read_parquet(path).to_dicts()))
        else:
            parts.append(path.read_bytes().decode("utf-8", errors="replace"))
    return "\n".join(parts)


def prompt_carrying_results(folder: Path) -> Path:
    """vLLM and SGLang results each carrying prompt-like keys (and vLLM hints that are kept)."""
    folder.mkdir()
    vllm = vllm_point(prompt=SECRET, prompts=[SECRET], gpu="1xH100", deployment="blue")
    (folder / "vllm.json").write_text(json.dumps(vllm))
    sglang = {
        "backend": "sglang",
        "dataset_name": "random",
        "request_rate": 2.0,
        "max_concurrency": None,
        "duration": 100.0,
        "completed": 200,
        "total_input_tokens": 20000,
        "total_output_tokens": 20000,
        "request_throughput": 2.0,
        "output_throughput": 200.0,
        "median_ttft_ms": 50.0,
        "p99_ttft_ms": 90.0,
        "median_itl_ms": 10.0,
        "p99_itl_ms": 15.0,
        "mean_e2e_latency_ms": 1000.0,
        "median_e2e_latency_ms": 1000.0,
        "input_text": SECRET,
    }
    (folder / "sglang.jsonl").write_text(json.dumps(sglang) + "\n")
    (folder / "enginefit-bench.yaml").write_text(MANIFEST_YAML + "label_from: deployment\n")
    return folder


def test_prompt_like_keys_are_never_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = prompt_carrying_results(tmp_path / "results")
    config = with_bench_section(tmp_path, f"{{results: [{results}]}}")
    # configured mode writes the load points, per-request rows and notes; ad hoc --out the rest
    assert main(["bench", "--config", str(config), "--json"]) == 0
    configured_out = capsys.readouterr().out
    assert main(["bench", str(results), "--out", str(tmp_path / "adhoc"), "--json"]) == 0
    adhoc_out = capsys.readouterr().out
    written = written_text(tmp_path / "data") + written_text(tmp_path / "adhoc")
    for text in (written, configured_out, adhoc_out):
        assert "Jane Roe" not in text and "patient" not in text
    points = pl.read_parquet(tmp_path / "data" / "t" / "bench" / "load_points.parquet")
    by_tool = {row["tool"]: row for row in points.iter_rows(named=True)}
    # allowlisted hints stay; the manifest's label_from still reads the free-form key
    vllm = by_tool["vllm_bench_serve"]
    assert json.loads(vllm["file_metadata"]) == {"deployment": "blue", "gpu": "1xH100"}
    assert vllm["label"] == "blue"
    assert vllm["row_notes"] == [
        "2 free-form key(s) not kept (not on the reader's allowlist, or not a short value; a "
        "result file may carry prompts): prompt, prompts"
    ]
    sglang = by_tool["sglang_bench_serving"]
    assert sglang["file_metadata"] is None
    assert "1 free-form key(s) not kept" in " ".join(sglang["row_notes"])


def test_allowlisted_key_with_a_long_value_is_dropped(tmp_path: Path) -> None:
    path = write_result(tmp_path / "r", vllm_point(gpu=SECRET * 10))
    row = read_bench_files([path]).load_points.row(0, named=True)
    assert row["file_metadata"] is None
    assert row["row_notes"] == [
        "1 free-form key(s) not kept (not on the reader's allowlist, or not a short value; a "
        "result file may carry prompts): gpu"
    ]


# --------------------------------------------------------------------- 3. the terminal table

H100 = Path(__file__).resolve().parent / "data" / "bench" / "inference-perf"


def test_text_fits_a_terminal_and_shows_values_against_limits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real H100 sweep plus a closed-loop aiperf run of a long-named model: every line fits
    100 columns, the key columns are there, and each point that did not pass shows its value
    against the limit."""
    sweep = tmp_path / "h100"
    shutil.copytree(H100 / "kubecon-na-2025-vllm-h100", sweep)
    (sweep / "enginefit-bench.yaml").write_text(MANIFEST_YAML)
    aiperf = aiperf_concurrency_one(request_rate_mode="concurrency_burst")
    aiperf["input_config"]["endpoint"]["model_names"] = ["org/" + "very-long-model-name-" * 6]
    closed = write_result(tmp_path / "aiperf", aiperf, "profile_export_aiperf.json")
    # Dated after the aiperf run (2026-01-31): a report cannot predate a benchmark it reads.
    argv = ["bench", str(sweep), str(closed), "--gpu-hour-usd", "3", "--as-of", "2026-02-01"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    flat = " ".join(" ".join(lines).split())  # wrapped lines joined again
    header = lines.index("Open loop (ranked within pools)") + 1
    assert lines[header].split() == [
        *["#", "sweep", "capacity", "at", "load", "req/s", "out", "tok/s", "$/GPU-h"],
        *["$/1M", "out", "rank"],
    ]
    # [1] the H100 sweep, [2] the aiperf run (labels in order). 92.19 req/s × 62.33 tokens =
    # 5,748 tok/s; $3 ÷ (5,748 × 3600) × 10^6 = $0.145. Not ranked: the two are not comparable.
    assert lines[header + 1].split() == [
        *["[1]", "open", "bracketed", "92.19", "req/s", "92.2", "5,748", "3", "0.145", "—"]
    ]
    closed_header = next(i for i, line in enumerate(lines) if line.startswith("Closed loop")) + 2
    # 1.5 req/s × 20 tokens = 30 tok/s; $3 ÷ (30 × 3600) × 10^6 = $27.8, shown apart
    assert lines[closed_header + 1].split() == [
        *["[2]", "closed", "not_bracketed", "1", "user", "1.5", "30", "3", "27.8", "—"]
    ]
    assert "[1] 122.59 req/s: fail: p95 TTFT 3187.2 ms > 1000 ms;" in flat
    assert (
        "[1] 1 req/s: unknown: only 60 completed requests; p99 ITL (per-gap) needs ≥ 100 "
        "(measured 7.4 ms, limit ≤ 60 ms)" in flat
    )
    assert "[2] closed_loop flag: 1 closed-loop point(s) at concurrency 1" in flat
    # wide columns stay in --json / Parquet only
    assert "cost_workings" not in text.split("Every column")[0]
    assert "5,748 output tok/s" not in text
    # alone, the sweep is ranked: first of the bracketed pool
    assert main(["bench", str(sweep), "--gpu-hour-usd", "3"]) == 0
    alone = capsys.readouterr().out.splitlines()
    row = alone[alone.index("Open loop (ranked within pools)") + 2]
    assert row.split()[-2:] == ["1", "bracketed"]


# -------------------------------------------------------- 4 and 7. workload facts and prices


def shaped_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path]:
    """The peaky trace (60 s peak 150 req/s) as canonical Parquet: what `enginefit shape --json`
    prints (saved to a file), and the facts file `enginefit shape --out DIR` writes."""
    write_requests(peaky_sharing_trace(), tmp_path / "trace")
    requests = str(tmp_path / "trace" / "requests")
    assert main(["shape", requests, "--json"]) == 0
    printed = tmp_path / "shape.json"
    printed.write_text(capsys.readouterr().out)
    assert main(["shape", requests, "--out", str(tmp_path / "shaped")]) == 0
    capsys.readouterr()
    return printed, tmp_path / "shaped" / "shape" / "workload_facts.json"


def test_workload_facts_from_shape_json_or_the_facts_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    printed, facts_file = shaped_workload(tmp_path, capsys)
    result = str(write_result(tmp_path / "r", vllm_point()))
    by_source = {}
    for source in (printed, facts_file, facts_file.parent.parent):
        payload = bench_json(capsys, result, "--gpu-hour-usd", "2", "--workload-facts", str(source))
        by_source[source] = payload
        fleet = {row["rate_label"]: row for row in payload["fleet"]}
        # 9,000 requests in the peak minute = 150 req/s over a 2 req/s capacity: 75 replicas
        assert fleet["peak_60s"]["replicas"] == 75
        peak = next(f for f in payload["findings"] if f["check"] == "peak_rate")
        assert peak["prod_value"] == pytest.approx(150.0) and peak["status"] == "flag"
    assert by_source[printed]["workload_facts"] == str(printed)
    assert by_source[facts_file]["workload_facts"] == str(facts_file)
    folder = facts_file.parent.parent  # a workload folder: its shape (and prefix) outputs
    assert by_source[folder]["workload_facts"] == (
        f"workload folder {folder}: shape/workload_shape.json (no `enginefit prefix` output: "
        "prefix sharing unknown)"
    )
    assert by_source[printed]["fleet"] == by_source[facts_file]["fleet"]


EXPECTED = (
    "expected shape/workload_facts.json (written by `enginefit shape TRACE... --out DIR`) or "
    "what `enginefit shape TRACE... --json` prints"
)


@pytest.mark.parametrize(
    ("content", "found"),
    [
        ("[1, 2]", "not workload facts (found a JSON array)"),
        ('{"ttft_p95_ms": 1}', "not workload facts (found keys ttft_p95_ms)"),
        ("{}", "not workload facts (found {})"),
        ("not json", "not valid JSON (Expecting value at line 1 column 1)"),
    ],
)
def test_other_workload_facts_files_are_one_line(
    content: str, found: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = write_result(tmp_path / "r", vllm_point())
    facts = tmp_path / "facts.json"
    facts.write_text(content)
    line = bench_error(capsys, str(result), "--workload-facts", str(facts))
    assert line == f"enginefit: error: {facts}: {found}; {EXPECTED}"


def test_shape_json_without_facts_fields_names_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = write_result(tmp_path / "r", vllm_point())
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps({"shape": {}, "facts": {"requests": 3}}))
    line = bench_error(capsys, str(result), "--workload-facts", str(facts))
    assert (
        line
        == f"enginefit: error: {facts}: facts: not workload facts (found keys requests); {EXPECTED}"
    )
    missing = tmp_path / "nope"
    line = bench_error(capsys, str(result), "--workload-facts", str(missing))
    assert line == f"enginefit: error: --workload-facts: {missing}: no such file or folder"
    empty = tmp_path / "empty"
    empty.mkdir()
    line = bench_error(capsys, str(result), "--workload-facts", str(empty))
    assert line == (
        f"enginefit: error: --workload-facts: {empty} is a folder without shape results "
        f"({empty / 'shape' / 'workload_shape.json'} is missing); write them with `enginefit "
        f"shape TRACE... --out {empty}`, or name a facts file"
    )


def project_folder(tmp_path: Path) -> Path:
    """A project with ./enginefit.yaml: a workload with shape outputs and an H100 price."""
    write_requests(peaky_sharing_trace(), tmp_path / "data" / "t")
    config = with_bench_section(tmp_path, "{prices: {gpu_hour_usd: {H100: 4.0}}}")
    assert main(["shape", "--config", str(config)]) == 0
    return config


def test_adhoc_results_ignore_the_configured_workload_unless_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Someone else's result files, run in a project folder (./enginefit.yaml picked up): the
    configured prices apply and are named; the configured workload's facts are not used until
    --workload-facts names its folder."""
    config = project_folder(tmp_path)  # tests run in tmp_path: ./enginefit.yaml is this one
    capsys.readouterr()
    result = str(write_result(tmp_path / "theirs", vllm_point()))
    root = tmp_path / "data" / "t"
    payload = bench_json(capsys, result)
    assert payload["workload_facts"] == (
        "none (ad hoc: give --workload-facts FILE|DIR to check against one; the configured "
        f"workload t is used only when named: --workload-facts {root})"
    )
    assert payload["fleet"] == []
    assert payload["prices_source"] == (
        "the configuration's bench.prices by GPU type (H100 4), then the manifests' "
        "price_per_gpu_hour_usd"
    )
    (cap,) = payload["capacity"]
    assert (cap["gpu_hour_usd"], cap["price_source"]) == (4.0, "config gpu_hour_usd.H100")
    # the text says both in its first lines
    assert main(["bench", result]) == 0
    out, err = capsys.readouterr()
    assert err.startswith(f"enginefit bench: configuration: {config} (workload t); workload: ")
    assert "\nworkload facts: none (ad hoc: give --workload-facts FILE|DIR" in out
    flat = " ".join(out.split())
    assert (
        "prices ($/GPU-hour): the configuration's bench.prices by GPU type (H100 4), then the "
        "manifests' price_per_gpu_hour_usd"
    ) in flat
    # named: the configured workload's facts are used, and said
    named = bench_json(capsys, result, "--workload-facts", str(root))
    assert named["workload_facts"] == (
        f"workload folder {root}: shape/workload_shape.json (no `enginefit prefix` output: "
        "prefix sharing unknown)"
    )
    assert {row["rate_label"] for row in named["fleet"]} >= {"mean", "peak_60s"}


def test_price_source_without_any_price(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    payload = bench_json(capsys, str(write_result(tmp_path / "r", vllm_point())))
    assert payload["prices_source"] == (
        "the manifests' price_per_gpu_hour_usd only (no bench.prices configured); without one "
        "the cost is unknown"
    )
    assert payload["capacity"][0]["cost_per_1m_output_usd"] is None


# ------------------------------------------------------------ 5. the command line's language


def test_missing_manifest_speaks_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(vllm_point()))
    line = bench_error(capsys, str(path))
    assert "manifest=" not in line
    assert line.endswith(
        "or give one with --manifest FILE (configuration key bench.manifest) with keys engine, "
        "gpu_type, gpu_count"
    )
