"""Benchmark readers on real result files.

Two sources: the permissively licensed copies committed under ``tests/data/bench/`` (always run)
and every file under ``../shared/bench-samples/`` (skipped when that folder is absent; the
unlicensed ones — vLLM, genai-perf, one guidellm file — are only ever read from there).

Each test copies the files into a tmp folder and writes the sidecar manifest there, so engine
and GPU come from the manifest as in real use. Expected values are read straight from the JSON in
the test, with the unit conversion spelled out beside each check.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import yaml

from pipeline.bench.readers import read_bench_files
from pipeline.bench.schema import LOAD_POINT_SCHEMA, PER_REQUEST_SCHEMA

DATA = Path(__file__).resolve().parent / "data" / "bench"
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "bench-samples"
MANIFEST = {"engine": "vllm", "engine_version": "0.11.0", "gpu_type": "H100-80GB", "gpu_count": 1}


def shared(sub: str) -> Path:
    folder = SHARED / sub
    if not folder.is_dir():
        pytest.skip(f"{folder} not present")
    return folder


def stage(tmp: Path, src: Path, manifest: dict[str, Any] | None = None) -> Path:
    """Copy a sample folder into tmp and write ``enginefit-bench.yaml`` beside it."""
    dst = tmp / src.name
    shutil.copytree(src, dst)
    for md in dst.rglob("*.md"):
        md.unlink()
    (dst / "enginefit-bench.yaml").write_text(yaml.safe_dump(manifest or MANIFEST))
    return dst


def row(frame: pl.DataFrame, **where: Any) -> dict[str, Any]:
    sel = frame
    for k, v in where.items():
        sel = sel.filter(pl.col(k) == v)
    assert sel.height == 1, (where, sel.height)
    return sel.row(0, named=True)


def close(a: float | None, b: float | None, rel: float = 1e-9) -> bool:
    assert a is not None and b is not None, (a, b)
    return math.isclose(a, b, rel_tol=rel)


# ---------------------------------------------------------------------------------------------
# inference-perf (committed copy, Apache-2.0)


def test_inference_perf_stage_files(tmp_path: Path) -> None:
    folder = stage(tmp_path, DATA / "inference-perf" / "kubecon-na-2025-vllm-h100")
    result = read_bench_files([folder])
    lp = result.load_points
    assert lp.schema == LOAD_POINT_SCHEMA
    assert lp.height == 7  # stage_0..6; the cross-stage summary is not a load point
    assert lp.get_column("record_index").to_list() == list(range(7))
    assert (lp.get_column("tool") == "inference_perf").all()
    assert any("summary_lifecycle_metrics.json" in n and "skipped" in n for n in result.notes)
    assert result.per_request is None
    raw = json.loads((folder / "stage_3_lifecycle_metrics.json").read_text())
    r = row(lp, record_index=3)
    # engine/GPU come from the sidecar manifest, model from config.yaml server.model_name
    assert (r["engine"], r["engine_version"], r["gpu_type"], r["gpu_count"]) == (
        "vllm",
        "0.11.0",
        "H100-80GB",
        1,
    )
    assert r["model"] == "meta-llama/Meta-Llama-3-8B-Instruct"
    assert r["manifest_file"] == str(folder / "enginefit-bench.yaml")
    assert (r["load_mode"], r["arrival_process"]) == ("open", "constant")  # config load.type
    # load_summary.requested_rate / achieved_rate are req/s already
    assert r["offered_rate_rps"] == raw["load_summary"]["requested_rate"] == 92.19
    assert close(r["achieved_rate_rps"], raw["load_summary"]["achieved_rate"])
    lat = raw["successes"]["latency"]
    # all inference-perf latencies are seconds: × 1000 → ms; "median" is p50
    assert close(r["ttft_p95_ms"], lat["time_to_first_token"]["p95"] * 1000)
    assert close(r["ttft_p95_ms"], 80.24103753268719)
    assert close(r["ttft_p50_ms"], lat["time_to_first_token"]["median"] * 1000)
    assert close(r["itl_p99_ms"], lat["inter_token_latency"]["p99"] * 1000)  # pooled gaps
    assert close(r["tpot_p99_ms"], lat["time_per_output_token"]["p99"] * 1000)
    assert close(r["e2e_max_ms"], lat["request_latency"]["max"] * 1000)
    assert (r["ttft_source"], r["itl_source"], r["tpot_source"]) == ("native",) * 3
    assert r["itl_definition"] == "per_gap_pooled"
    assert r["tpot_definition"] == "decode_per_request"
    assert close(r["output_tokens_per_s"], raw["successes"]["throughput"]["output_tokens_per_sec"])
    assert (r["completed"], r["failed"], r["error_rate"]) == (5531, 0, 0.0)
    # late-2025 layout: prompt_len.mean × successes.count → total input tokens
    assert r["total_input_tokens"] == round(raw["successes"]["prompt_len"]["mean"] * 5531)
    assert r["output_len_target"] == 64  # config.yaml data.shared_prefix.output_len
    # duration derived as successes.count / requests_per_sec (no benchmark_time_seconds)
    assert close(r["duration_s"], 5531 / raw["successes"]["throughput"]["requests_per_sec"])
    assert r["duration_kind"] == "derived"
    # stages 4-6: the client could not reach the requested rate (SOURCE.md: ~106 req/s)
    for k in (4, 5, 6):
        rk = row(lp, record_index=k)
        assert rk["achieved_rate_rps"] < 0.95 * rk["offered_rate_rps"]
        assert any("below the requested" in n for n in rk["row_notes"])
    assert row(lp, record_index=3)["row_notes"] == []
    # SLO sanity (SOURCE.md): p95 TTFT < 1 s up to stage 3, > 3 s from stage 4 on
    p95 = lp.sort("record_index").get_column("ttft_p95_ms").to_list()
    assert all(x < 1000 for x in p95[:4]) and all(x > 3000 for x in p95[4:])


def test_inference_perf_summary_alone_is_skipped_not_read(tmp_path: Path) -> None:
    folder = tmp_path / "ip"
    folder.mkdir()
    src = DATA / "inference-perf" / "kubecon-na-2025-vllm-h100" / "summary_lifecycle_metrics.json"
    shutil.copy(src, folder / src.name)
    (folder / "stage_2_lifecycle_metrics.json").write_bytes(
        (src.parent / "stage_2_lifecycle_metrics.json").read_bytes()
    )
    result = read_bench_files([folder], manifest=MANIFEST)
    assert result.load_points.get_column("record_index").to_list() == [2]
    assert any("cross-stage summary" in n for n in result.notes)


# ---------------------------------------------------------------------------------------------
# SGLang (committed copy, MIT)


def test_sglang_2024_jsonl_with_bare_infinity(tmp_path: Path) -> None:
    folder = stage(tmp_path, DATA / "sglang-bench-serving", {**MANIFEST, "engine": "sglang"})
    lp = read_bench_files([folder]).load_points
    assert lp.height == 14  # 7 lines per file
    assert (lp.get_column("tool") == "sglang_bench_serving").all()
    assert (lp.get_column("source_schema") == "sglang-2024").all()
    online = folder / "datacrunch_h200x4_llama33-70b_online_output.jsonl"
    lines = [json.loads(x) for x in online.read_text().splitlines() if x.strip()]
    line5 = lines[4]
    r = row(lp, source_file=str(online), record_index=4)
    assert r["offered_rate_rps"] == line5["request_rate"] == 16.0
    assert (r["load_mode"], r["arrival_process"]) == ("open", "poisson")
    # SGLang latencies are ms already
    assert close(r["ttft_p50_ms"], line5["median_ttft_ms"])
    assert close(r["itl_p50_ms"], line5["median_itl_ms"])
    assert close(r["e2e_mean_ms"], line5["mean_e2e_latency_ms"])
    # 2024 format: no p95/p99 at all → null, flagged native (p50 present), never interpolated
    assert r["ttft_p95_ms"] is None and r["ttft_p99_ms"] is None
    assert r["ttft_source"] == "native" and r["tpot_source"] == "missing"
    # no request_throughput in the 2024 format: completed / duration
    assert close(r["request_throughput_rps"], 3200 / line5["duration"])
    assert r["failed"] is None and r["error_rate"] is None  # SGLang has no failure count
    assert r["completed"] == 3200
    assert r["total_output_tokens"] == line5["total_output_tokens"]
    # random dataset with random_range_ratio 0.0 → lengths uniform in [1, 1024], not fixed
    assert (r["input_len_target"], r["input_len_fixed"]) == (1024, False)
    assert r["engine"] == "sglang" and r["model"] is None  # no model in 2024 files
    offline = lp.filter(pl.col("source_file").str.ends_with("offline_output.jsonl"))
    # "request_rate": Infinity (bare token) → +inf, everything sent at once
    assert offline.get_column("offered_rate_rps").is_infinite().all()
    assert (offline.get_column("load_mode") == "offline").all()


# ---------------------------------------------------------------------------------------------
# llmperf (committed copy, Apache-2.0): summary + individual responses


def test_llmperf_recomputed_matches_numpy_and_native(tmp_path: Path) -> None:
    folder = stage(tmp_path, DATA / "llmperf", {**MANIFEST, "engine": "together-hosted"})
    result = read_bench_files([folder])
    lp = result.load_points
    assert lp.height == 1
    r = lp.row(0, named=True)
    summary = json.loads((folder / "leaderboard_together_70b_summary.json").read_text())
    ind = json.loads((folder / "leaderboard_together_70b_individual_responses.json").read_text())
    assert (r["tool"], r["load_mode"], r["concurrency"]) == ("llmperf", "closed", 5)
    assert r["offered_rate_rps"] is None  # closed loop: no offered rate
    assert (r["completed"], r["failed"], r["num_requests"]) == (150, 0, 150)
    # results_num_completed_requests_per_min / 60 → req/s
    assert close(
        r["request_throughput_rps"], summary["results_num_completed_requests_per_min"] / 60
    )
    assert close(r["output_tokens_per_s"], summary["results_mean_output_throughput_token_per_s"])
    # independent numpy reference over the individual responses (seconds → ms, linear)
    ok = [x for x in ind if x["error_code"] is None and not x["error_msg"]]
    ttft = np.array([x["ttft_s"] for x in ok]) * 1000
    e2e = np.array([x["end_to_end_latency_s"] for x in ok]) * 1000
    out = np.array([x["number_output_tokens"] for x in ok])
    tpot = ((e2e - ttft) / (out - 1))[out > 1]
    for q in (50, 90, 95, 99):
        assert close(r[f"ttft_p{q}_ms"], float(np.percentile(ttft, q)))
        assert close(r[f"e2e_p{q}_ms"], float(np.percentile(e2e, q)))
        assert close(r[f"tpot_p{q}_ms"], float(np.percentile(tpot, q)))
    assert close(r["ttft_mean_ms"], float(ttft.mean()))
    assert close(r["e2e_max_ms"], float(e2e.max()))
    # llmperf's own quantiles are pandas-linear too: recomputed == native (seconds × 1000)
    assert close(r["ttft_p95_ms"], summary["results_ttft_s_quantiles_p95"] * 1000)
    assert close(r["e2e_p99_ms"], summary["results_end_to_end_latency_s_quantiles_p99"] * 1000)
    assert (r["ttft_source"], r["tpot_source"], r["e2e_source"]) == ("recomputed",) * 3
    assert r["itl_source"] == "missing"  # llmperf has no per-gap data
    assert r["percentile_method"] == "numpy-linear"
    # llmperf's inter_token_latency (includes TTFT) is kept only in native_stats
    native = json.loads(r["native_stats"])
    assert close(
        native["llmperf_inter_token_latency_p99_ms"],
        summary["results_inter_token_latency_s_quantiles_p99"] * 1000,
    )
    # "550" strings in *_min/_max are accepted: input fixed, output varies 41..188
    assert (r["input_len_fixed"], r["output_len_fixed"]) == (True, False)
    assert close(r["output_tokens_mean"], summary["results_number_output_tokens_mean"])
    assert json.loads(r["file_metadata"]) == {"framework": "together", "model_size": "70b"}
    assert str(r["run_date"]) == "2023-12-19"  # timestamp 1702985493 UTC
    pr = result.per_request
    assert pr is not None and pr.schema == PER_REQUEST_SCHEMA and pr.height == 150
    assert any("individual responses" in n and "not a load point" in n for n in result.notes)


# ---------------------------------------------------------------------------------------------
# guidellm (committed copies, Apache-2.0) and the XPU run (shared only)


def _guidellm_block(bench: dict[str, Any], name: str) -> dict[str, Any]:
    block: dict[str, Any] = bench["metrics"][name]["successful"]
    return block


def test_guidellm_g2_and_g4(tmp_path: Path) -> None:
    folder = stage(tmp_path, DATA / "guidellm")
    lp = read_bench_files([folder]).load_points
    g2_path = folder / "guidellm-testasset_benchmarks_stripped_v0.3-schema.json"
    g2 = row(lp, source_file=str(g2_path))
    bench = json.loads(g2_path.read_text())["benchmarks"][0]
    assert g2["source_schema"] == "guidellm-G2"
    assert (g2["load_mode"], g2["arrival_process"], g2["concurrency"]) == (
        "closed",
        "synchronous",
        1,
    )
    assert (g2["completed"], g2["failed"], g2["incomplete"], g2["num_requests"]) == (46, 0, 1, 47)
    ttft = _guidellm_block(bench, "time_to_first_token_ms")
    assert close(g2["ttft_p95_ms"], ttft["percentiles"]["p95"])
    assert close(g2["ttft_p50_ms"], ttft["median"])  # G2 percentiles have no p50
    # request_latency is seconds in guidellm → × 1000
    assert close(
        g2["e2e_p99_ms"], _guidellm_block(bench, "request_latency")["percentiles"]["p99"] * 1000
    )
    # guidellm "ITL" is per-request (token-weighted) → tpot; per-gap ITL missing
    itl = _guidellm_block(bench, "inter_token_latency_ms")
    assert close(g2["tpot_p99_ms"], itl["percentiles"]["p99"])
    assert g2["tpot_definition"] == "decode_token_weighted"
    assert g2["itl_source"] == "missing" and g2["itl_p99_ms"] is None
    assert g2["model"] == "example_model"
    g4_path = folder / "llmd-fixture_mockserver_guidellm0.8dev_schema2.json"
    g4 = lp.filter(pl.col("source_file") == str(g4_path)).sort("record_index")
    assert g4.get_column("source_schema").to_list() == ["guidellm-G4"] * 2
    assert g4.get_column("offered_rate_rps").to_list() == [2.0, 4.0]  # config.strategy.rate
    assert g4.get_column("tool_version").to_list() == ["0.8.0.dev18"] * 2
    assert g4.get_column("model").to_list() == ["e2e-mock-model"] * 2
    assert (g4.get_column("arrival_process") == "constant").all()


def test_guidellm_yaml_equals_json(tmp_path: Path) -> None:
    src = DATA / "guidellm" / "guidellm-testasset_benchmarks_stripped_v0.3-schema.json"
    (tmp_path / "benchmarks.yaml").write_text(yaml.safe_dump(json.loads(src.read_text())))
    shutil.copy(src, tmp_path / "benchmarks.json")
    lp = read_bench_files([tmp_path], manifest=MANIFEST).load_points
    cols = [c for c in lp.columns if c not in ("point_id", "source_file", "source_sha256")]
    a = lp.filter(pl.col("source_file").str.ends_with(".json")).select(cols)
    b = lp.filter(pl.col("source_file").str.ends_with(".yaml")).select(cols)
    assert a.equals(b)


def test_guidellm_xpu_shared(tmp_path: Path) -> None:
    src = shared("guidellm") / "korat_intel-xpu_qwen3-30b-a3b_tp4_fp8_benchmarks_v0.5-schema1.json"
    shutil.copy(src, tmp_path / src.name)
    (tmp_path / "enginefit-bench.yaml").write_text(
        yaml.safe_dump(
            {"engine": "vllm", "gpu_type": "Intel-XPU", "gpu_count": 4, "quantization": "fp8"}
        )
    )
    lp = read_bench_files([tmp_path]).load_points
    r = lp.row(0, named=True)
    bench = json.loads(src.read_text())["benchmarks"][0]
    assert (r["source_schema"], r["tool_version"]) == ("guidellm-G3'", "0.5.0.dev0")
    assert (r["completed"], r["quantization"], r["gpu_count"]) == (19, "fp8", 4)
    assert close(
        r["ttft_p95_ms"], _guidellm_block(bench, "time_to_first_token_ms")["percentiles"]["p95"]
    )
    assert close(r["duration_s"], 720.0) and r["duration_kind"] == "measure_window"
    assert any("23 successful requests listed but 19" in n for n in r["row_notes"])
    assert r["model"] == "Qwen/Qwen3-30B-A3B"


# ---------------------------------------------------------------------------------------------
# vLLM and genai-perf: shared only (no licence → never copied into the project)


def test_vllm_appended_jsonl_named_json_shared(tmp_path: Path) -> None:
    src = shared("vllm-bench-serve") / "nerdalert_l40s_llmd_results.jsonl"
    dst = tmp_path / "results.json"  # upstream name: JSONL in a .json file
    shutil.copy(src, dst)
    (tmp_path / "results.json.manifest.yaml").write_text(
        yaml.safe_dump(
            {"engine": "vllm", "gpu_type": "L40S", "gpu_count": 4, "label_from": "deployment"}
        )
    )
    lp = read_bench_files([dst]).load_points
    assert lp.height == 9
    assert (lp.get_column("source_schema") == "vllm-2025-early").all()
    lines = [json.loads(x) for x in src.read_text().splitlines() if x.strip()]
    for i, line in enumerate(lines):
        r = row(lp, record_index=i)
        assert r["label"] == line["deployment"]  # manifest label_from: deployment
        assert close(r["ttft_p99_ms"], line["p99_ttft_ms"])  # ms already
        assert close(r["itl_p99_ms"], line["p99_itl_ms"])
        assert close(r["tpot_p99_ms"], line["p99_tpot_ms"])
        assert close(r["ttft_p50_ms"], line["median_ttft_ms"])
        assert r["ttft_p95_ms"] is None  # only p99 was requested: missing, not interpolated
        assert r["e2e_source"] == "missing"  # default --percentile-metrics has no e2el
        # no "failed" key in early-2025 files: num_prompts − completed
        assert r["failed"] == line["num_prompts"] - line["completed"]
        assert close(r["output_tokens_per_s"], line["output_throughput"])
        assert r["goodput_rps"] is None  # "request_goodput:" (trailing colon) is null
        if line["request_rate"] == "inf":
            assert math.isinf(r["offered_rate_rps"]) and r["load_mode"] == "offline"
        else:
            assert r["offered_rate_rps"] == line["request_rate"] and r["load_mode"] == "open"
        assert str(r["run_date"]) == f"{line['date'][:4]}-{line['date'][4:6]}-{line['date'][6:8]}"
        assert json.loads(r["file_metadata"])["gpu"] == "4xNVIDIA_L40S"  # hint only
        assert (r["gpu_type"], r["gpu_count"]) == ("L40S", 4)  # from the manifest


def test_genai_perf_shared(tmp_path: Path) -> None:
    src = shared("genai-perf") / "wellflat_a100_gpt-oss-20b_c1_profile_export_genai_perf.json"
    dst = tmp_path / "profile_export_genai_perf.json"
    shutil.copy(src, dst)
    lp = read_bench_files([dst], manifest={**MANIFEST, "gpu_type": "A100-80GB"}).load_points
    r = lp.row(0, named=True)
    raw = json.loads(src.read_text())
    assert (r["tool"], r["load_mode"], r["concurrency"]) == ("genai_perf", "closed", 1)
    assert r["completed"] == 35 and r["failed"] is None
    assert close(r["ttft_p95_ms"], raw["time_to_first_token"]["p95"])  # unit "ms"
    # genai-perf inter_token_latency is per request (e2e−ttft)/(osl−1) → tpot, not itl
    assert close(r["tpot_p99_ms"], raw["inter_token_latency"]["p99"])
    assert r["itl_source"] == "missing"
    assert close(r["e2e_p95_ms"], raw["request_latency"]["p95"])
    assert close(r["duration_s"], 35 / raw["request_throughput"]["avg"])
    assert r["model"] == "openai/gpt-oss-20b"
    assert json.loads(r["file_metadata"])["input_config.endpoint.backend"] == "tensorrtllm"


@pytest.mark.parametrize(
    ("sub", "tools"),
    [
        ("vllm-bench-serve", {"vllm_bench_serve"}),
        ("sglang-bench-serving", {"sglang_bench_serving"}),
        ("guidellm", {"guidellm"}),
        ("genai-perf", {"genai_perf"}),
        ("llmperf", {"llmperf"}),
        ("inference-perf", {"inference_perf"}),
    ],
)
def test_every_shared_sample_reads(tmp_path: Path, sub: str, tools: set[str]) -> None:
    folder = stage(tmp_path, shared(sub))
    result = read_bench_files([folder])
    lp = result.load_points
    assert lp.height > 0 and set(lp.get_column("tool").to_list()) == tools
    assert lp.schema == LOAD_POINT_SCHEMA
    assert lp.get_column("point_id").n_unique() == lp.height
    for m in ("ttft", "tpot", "itl", "e2e"):
        assert set(lp.get_column(f"{m}_source").to_list()) <= {"native", "recomputed", "missing"}
    assert set(lp.get_column("load_mode").to_list()) <= {"open", "closed", "offline"}
    # deterministic: a second read is identical
    again = read_bench_files([folder]).load_points
    assert lp.equals(again)
