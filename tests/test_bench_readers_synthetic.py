"""Benchmark readers on small synthetic files: per-request recomputation, detection by content,
manifests, and malformed input.

Recomputed percentiles are checked against an independent plain-numpy computation with the
documented method: ``np.percentile(samples, q)`` (numpy's default ``linear`` method) over the
successful requests — ttft/e2e/tpot one sample per request, ITL one sample per gap, pooled.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import yaml

from pipeline.bench.detect import Document
from pipeline.bench.manifest import BenchManifestError
from pipeline.bench.percentiles import recompute_stats
from pipeline.bench.readers import BenchFormatError, detect_kind, read_bench_files
from pipeline.bench.readers._common import BenchFieldError
from pipeline.bench.schema import LOAD_POINT_SCHEMA

MANIFEST = {"engine": "vllm", "gpu_type": "H100", "gpu_count": 2}


def close(a: float | None, b: float, rel: float = 1e-9) -> bool:
    assert a is not None
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def write_manifest(folder: Path, **over: Any) -> None:
    (folder / "enginefit-bench.yaml").write_text(yaml.safe_dump({**MANIFEST, **over}))


def vllm_record(rng: np.random.Generator, n: int, n_failed: int, **header: Any) -> dict[str, Any]:
    """A current-format vLLM result with per-request arrays (seconds), failures at the end."""
    ok = np.array([True] * (n - n_failed) + [False] * n_failed)
    out_lens = rng.integers(1, 40, n)
    out_lens[~ok] = 0
    ttfts = rng.uniform(0.02, 0.5, n)
    itls = [list(rng.uniform(0.005, 0.08, max(int(k) - 1, 0))) for k in out_lens]
    latencies = np.array([t + sum(g) + 0.001 for t, g in zip(ttfts, itls, strict=True)])
    ttfts[~ok] = 0.0
    latencies[~ok] = 0.0
    starts = np.cumsum(rng.exponential(0.1, n)) + 1000.0
    rec: dict[str, Any] = {
        "date": "20260102-030405",
        "endpoint_type": "openai",
        "backend": "openai",
        "label": None,
        "model_id": "m/x",
        "tokenizer_id": "m/x",
        "num_prompts": n,
        "request_rate": 5.0,
        "burstiness": 1.0,
        "max_concurrency": None,
        "duration": 12.5,
        "completed": int(ok.sum()),
        "failed": n_failed,
        "total_input_tokens": 1000,
        "total_output_tokens": int(out_lens.sum()),
        "request_throughput": 3.0,
        "request_goodput": None,
        "output_throughput": 99.0,
        "total_token_throughput": 180.0,
        "mean_ttft_ms": 1.0,
        "median_ttft_ms": 2.0,
        "std_ttft_ms": 0.1,
        "p99_ttft_ms": 3.25,
        "mean_itl_ms": 1.0,
        "p99_itl_ms": 4.0,
        "input_lens": [int(x) for x in rng.integers(10, 20, n)],
        "output_lens": [int(x) for x in out_lens],
        "ttfts": [float(x) for x in ttfts],
        "itls": [[float(g) for g in row] for row in itls],
        "latencies": [float(x) for x in latencies],
        "start_times": [float(x) for x in starts],
        "errors": ["" if k else "HTTP 500" for k in ok],
        "generated_texts": ["secret output" for _ in ok],
    }
    rec.update(header)
    return rec


def numpy_reference(rec: dict[str, Any], key: str = "") -> dict[str, np.ndarray]:
    src = rec[key] if key else rec
    ok = np.array([e == "" for e in src["errors"]])
    ttft = np.array(src["ttfts"])[ok] * 1000
    gaps = np.concatenate([np.array(g) for g, k in zip(src["itls"], ok, strict=True) if k]) * 1000
    out = np.array(src["output_lens"])[ok]
    ref = {"ttft": ttft, "itl": gaps}
    if "latencies" in src:
        e2e = np.array(src["latencies"])[ok] * 1000
        ref["e2e"] = e2e
        ref["tpot"] = ((e2e - ttft) / np.maximum(out - 1, 1))[out > 1]
    else:
        decode = np.array([sum(g) for g, k in zip(src["itls"], ok, strict=True) if k]) * 1000
        ref["tpot"] = (decode / np.maximum(out - 1, 1))[out > 1]
    return ref


def test_vllm_per_request_recomputation(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    rec0 = vllm_record(rng, 60, 4)
    rec1 = vllm_record(rng, 30, 0, request_rate="inf", max_concurrency=8, burstiness=0.5)
    path = tmp_path / "bench.json"  # --append-result: JSONL in a .json file
    path.write_text(json.dumps(rec0) + "\n" + json.dumps(rec1) + "\n")
    write_manifest(tmp_path)
    result = read_bench_files([path])
    lp = result.load_points
    assert lp.schema == LOAD_POINT_SCHEMA and lp.height == 2
    r0 = lp.row(0, named=True)
    assert r0["source_schema"] == "vllm"
    for metric, samples in numpy_reference(rec0).items():
        assert r0[f"{metric}_source"] == "recomputed", metric
        for q in (50, 90, 95, 99):
            assert close(r0[f"{metric}_p{q}_ms"], float(np.percentile(samples, q))), (metric, q)
        assert close(r0[f"{metric}_mean_ms"], float(samples.mean()))
        assert close(r0[f"{metric}_max_ms"], float(samples.max()))
    # the tool's own aggregates are kept for cross-checks
    assert json.loads(r0["native_stats"])["ttft_p99_ms"] == 3.25
    assert (r0["completed"], r0["failed"], r0["num_requests"]) == (56, 4, 60)
    assert close(r0["error_rate"], 4 / 60)
    # achieved send rate from start_times: (n − 1) / (last − first)
    starts = np.array(rec0["start_times"])
    assert close(r0["achieved_rate_rps"], 59 / (starts.max() - starts.min()))
    assert (r0["load_mode"], r0["arrival_process"], r0["offered_rate_rps"]) == (
        "open",
        "poisson",
        5.0,
    )
    assert r0["has_per_request"] and r0["percentile_method"] == "numpy-linear"
    in_ok = np.array(rec0["input_lens"])[:56]
    assert close(r0["input_tokens_p99"], float(np.percentile(in_ok, 99)))
    # "inf" rate with a concurrency cap = N users back-to-back: closed loop, no offered rate
    r1 = lp.row(1, named=True)
    assert (r1["load_mode"], r1["concurrency"], r1["offered_rate_rps"]) == ("closed", 8, None)
    pr = result.per_request
    assert pr is not None and pr.height == 90
    assert pr.filter(pl.col("point_id") == r0["point_id"]).get_column("ok").sum() == 56
    assert "error" in pr.columns and "secret output" not in str(pr.to_dicts())


def test_vllm_gamma_and_legacy_goodput_key(tmp_path: Path) -> None:
    rec = {
        "date": "20250401-000000",
        "backend": "vllm",
        "model_id": "m",
        "num_prompts": 10,
        "request_rate": 2.0,
        "burstiness": 0.5,
        "max_concurrency": None,
        "duration": 5.0,
        "completed": 9,
        "request_goodput:": 1.5,
        "mean_ttft_ms": 10.0,
        "p99.9_ttft_ms": 20.0,
        "prefill_replicas": "0",
    }
    (tmp_path / "r.json").write_text(json.dumps(rec, indent=2))
    r = read_bench_files([tmp_path / "r.json"], manifest=MANIFEST).load_points.row(0, named=True)
    assert r["arrival_process"] == "gamma" and r["goodput_rps"] == 1.5
    assert r["failed"] == 1  # num_prompts − completed
    assert r["source_schema"] == "vllm-2025-early"
    assert json.loads(r["native_stats"])["ttft_p99.9_ms"] == 20.0
    assert json.loads(r["file_metadata"]) == {"prefill_replicas": "0"}  # not a percentile key
    assert r["ttft_p99_ms"] is None and r["ttft_source"] == "native"


def test_sglang_output_details_recomputation(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    base = vllm_record(rng, 40, 2)
    rec = {
        "backend": "sglang",
        "dataset_name": "random",
        "request_rate": math.inf,  # json.dumps writes the bare token Infinity
        "max_concurrency": None,
        "random_input_len": 512,
        "random_output_len": 64,
        "random_range_ratio": 1.0,
        "duration": 20.0,
        "completed": 38,
        "total_input_tokens": 100,
        "total_output_tokens": 200,
        "total_output_tokens_retokenized": 199,
        "request_throughput": 1.9,
        "median_ttft_ms": 1.0,
        "p99_ttft_ms": 2.0,
        "concurrency": 3.5,
        **{k: base[k] for k in ("input_lens", "output_lens", "ttfts", "itls", "errors")},
    }
    text = json.dumps(rec)
    assert "Infinity" in text
    (tmp_path / "sg.jsonl").write_text(text + "\n")
    write_manifest(tmp_path, engine="sglang")
    r = read_bench_files([tmp_path]).load_points.row(0, named=True)
    assert r["tool"] == "sglang_bench_serving" and r["source_schema"] == "sglang-2025"
    assert math.isinf(r["offered_rate_rps"]) and r["load_mode"] == "offline"
    assert (r["failed"], r["num_requests"], r["mean_concurrency"]) == (2, 40, 3.5)
    ref = numpy_reference(rec)
    for metric in ("ttft", "itl", "tpot"):
        assert r[f"{metric}_source"] == "recomputed"
        assert close(r[f"{metric}_p95_ms"], float(np.percentile(ref[metric], 95)))
    assert r["e2e_source"] == "missing"  # no per-request latency in SGLang details
    assert (r["input_len_fixed"], r["output_len_target"]) == (False, 64)  # data beats config


def aiperf_doc(itl_block: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema_version": "1.3",
        "aiperf_version": "0.10.0",
        "input_config": {
            "models": {"items": [{"name": "q/model"}]},
            "endpoint": {"type": "chat"},
            "loadgen": {"concurrency": 4},
        },
        "request_count": {"unit": "requests", "avg": 3},
        "error_request_count": {"unit": "requests", "avg": 1},
        "benchmark_duration": {"unit": "sec", "avg": 2.5},
        "request_throughput": {"unit": "requests/sec", "avg": 1.2},
        "output_token_throughput": {"unit": "tokens/sec", "avg": 50.0},
        "time_to_first_token": {"unit": "ms", "avg": 100.0, "p95": 150.0, "p99": 160.0},
        "inter_token_latency": {"unit": "ms", "avg": 9.0, "p99": 12.0},
        "inter_chunk_latency": itl_block,
        "request_latency": {"unit": "sec", "avg": 1.0, "p99": 1.5},
        "total_isl": {"unit": "tokens", "avg": 300},
        "total_osl": {"unit": "tokens", "avg": 90},
        "start_time": "2026-01-05T10:00:00Z",
        "telemetry_data": {"gpus": [{"gpu_name": "NVIDIA H100 80GB HBM3"}]},
    }


def test_aiperf_native_units(tmp_path: Path) -> None:
    (tmp_path / "profile_export_aiperf.json").write_text(
        json.dumps(aiperf_doc({"unit": "ns", "avg": 8e6, "p99": 2.0e7}))
    )
    r = read_bench_files([tmp_path], manifest=MANIFEST).load_points.row(0, named=True)
    assert (r["tool"], r["tool_version"], r["model"]) == ("aiperf", "0.10.0", "q/model")
    assert (r["load_mode"], r["concurrency"]) == ("closed", 4)
    assert (r["completed"], r["failed"], r["num_requests"]) == (3, 1, 4)
    assert r["duration_s"] == 2.5  # unit "sec"
    assert r["itl_p99_ms"] == 20.0  # inter_chunk_latency 2.0e7 ns → 20 ms (per gap → itl)
    assert r["tpot_p99_ms"] == 12.0  # inter_token_latency (per request) → tpot
    assert r["e2e_p99_ms"] == 1500.0  # 1.5 s → ms
    assert r["ttft_p95_ms"] == 150.0 and r["ttft_source"] == "native"
    assert str(r["run_date"]) == "2026-01-05"
    assert json.loads(r["file_metadata"])["telemetry_gpu_names"] == ["NVIDIA H100 80GB HBM3"]


def test_aiperf_jsonl_recomputation(tmp_path: Path) -> None:
    (tmp_path / "profile_export_aiperf.json").write_text(
        json.dumps(aiperf_doc({"unit": "ms", "avg": 8.0, "p99": 99.0}))
    )
    lines = []
    gaps_all: list[float] = []
    ttfts: list[float] = []
    for i in range(5):
        gaps = [5.0 + i + j for j in range(i + 2)]
        err = {"code": 500, "message": "boom"} if i == 4 else None
        if err is None:
            gaps_all += gaps
            ttfts.append(100.0 + 10 * i)
        lines.append(
            {
                "metadata": {
                    "request_start_ns": 10**9 * i,
                    "benchmark_phase": "profiling",
                },
                "metrics": {
                    "time_to_first_token": {"value": 100.0 + 10 * i, "unit": "ms"},
                    "request_latency": {"value": 0.5 + i, "unit": "sec"},
                    "inter_chunk_latency": {"value": gaps, "unit": "ms"},
                    "output_sequence_length": {"value": 10 + i, "unit": "tokens"},
                },
                "error": err,
            }
        )
    warm = {"metadata": {"request_start_ns": 0, "benchmark_phase": "warmup"}, "metrics": {}}
    text = "\n".join(json.dumps(x) for x in [warm, *lines]) + "\n"
    (tmp_path / "profile_export.jsonl").write_text(text)
    result = read_bench_files([tmp_path], manifest=MANIFEST)
    assert result.load_points.height == 1  # the jsonl is a companion, not a point
    r = result.load_points.row(0, named=True)
    assert r["itl_source"] == "recomputed"
    assert close(r["itl_p99_ms"], float(np.percentile(gaps_all, 99)))
    assert close(r["ttft_p50_ms"], float(np.percentile(ttfts, 50)))
    e2e = np.array([500.0 + 1000 * i for i in range(4)])
    out = np.array([10 + i for i in range(4)])
    tpot = (e2e - np.array(ttfts)) / (out - 1)
    assert close(r["tpot_p90_ms"], float(np.percentile(tpot, 90)))
    assert result.per_request is not None and result.per_request.height == 5  # warmup dropped


def test_genai_perf_raw_export_recomputation(tmp_path: Path) -> None:
    summary = {
        "request_throughput": {"unit": "requests/sec", "avg": 2.0},
        "request_latency": {"unit": "ms", "avg": 1.0, "p95": 1.0},
        "request_count": {"unit": "count", "avg": 3},
        "time_to_first_token": {"unit": "ms", "avg": 1.0, "p95": 1.0},
        "inter_token_latency": {"unit": "ms", "avg": 7.0, "p99": 7.5},
        "output_token_throughput": {"unit": "tokens/sec", "avg": 30.0},
        "input_config": {"model": ["a/b"], "concurrency": 2, "endpoint_type": "chat"},
    }
    (tmp_path / "profile_export_genai_perf.json").write_text(json.dumps(summary))
    reqs = [
        {
            "timestamp": 1_000_000_000,
            "response_timestamps": [1_050_000_000, 1_060_000_000, 1_075_000_000],
        },
        {"timestamp": 2_000_000_000, "response_timestamps": [2_080_000_000, 2_090_000_000]},
        {
            "timestamp": 3_000_000_000,
            "response_timestamps": [3_020_000_000, 3_021_000_000, 3_030_000_000],
        },
    ]
    raw = {
        "experiments": [{"experiment": {"mode": "concurrency", "value": 2}, "requests": reqs}],
        "version": "x",
        "service_kind": "openai",
    }
    (tmp_path / "profile_export.json").write_text(json.dumps(raw))
    result = read_bench_files([tmp_path], manifest=MANIFEST)
    r = result.load_points.row(0, named=True)
    ttft = np.array([50.0, 80.0, 20.0])  # (first response − timestamp) ns → ms
    gaps = np.array([10.0, 15.0, 10.0, 1.0, 9.0])  # consecutive response gaps ns → ms
    e2e = np.array([75.0, 90.0, 30.0])
    assert close(r["ttft_p95_ms"], float(np.percentile(ttft, 95)))
    assert close(r["itl_p50_ms"], float(np.percentile(gaps, 50)))
    assert close(r["e2e_max_ms"], float(e2e.max()))
    assert close(r["e2e_p50_ms"], float(np.percentile(e2e, 50)))
    assert (r["ttft_source"], r["itl_source"], r["e2e_source"]) == ("recomputed",) * 3
    assert (r["tpot_source"], r["tpot_p99_ms"]) == ("native", 7.5)  # no token counts in raw
    assert (r["load_mode"], r["concurrency"], r["model"]) == ("closed", 2, "a/b")


# ---------------------------------------------------------------------------------------------
# detection by content


@pytest.mark.parametrize(
    ("name", "obj", "kind"),
    [
        ("x.txt", {"mean_ttft_ms": 1, "burstiness": 1.0}, "vllm_bench_serve"),
        ("x.json", {"median_ttft_ms": 1, "mean_e2e_latency_ms": 2}, "sglang_bench_serving"),
        ("x.json", {"median_ttft_ms": 1, "concurrency": 2.0}, "sglang_bench_serving"),
        ("x.json", {"benchmarks": []}, "guidellm"),
        ("x.json", {"time_to_first_token": {"unit": "ms"}}, "genai_perf"),
        ("x.json", {"time_to_first_token": {"unit": "ms"}, "error_summary": []}, "aiperf"),
        ("x.json", {"experiments": [], "service_kind": "openai"}, "genai_perf_raw"),
        ("x.json", {"metadata": {"request_start_ns": 1}}, "aiperf_requests"),
        ("x.json", {"results_ttft_s_mean": 1.0}, "llmperf"),
        ("x.json", [{"ttft_s": 1.0}], "llmperf_requests"),
        (
            "stage_3_lifecycle_metrics.json",
            {"load_summary": {}, "successes": {}},
            "inference_perf",
        ),
        (
            "summary_lifecycle_metrics.json",
            {"load_summary": {}, "successes": {}},
            "inference_perf_summary",
        ),
        (
            "x.json",
            {"load_summary": {"requested_rate": 1}, "successes": {}},
            "inference_perf",
        ),
        ("config.yaml", {"load": {"type": "constant"}, "server": {}}, "inference_perf_config"),
    ],
)
def test_detect_kind(name: str, obj: Any, kind: str) -> None:
    assert detect_kind(Document(Path(name), "json", [obj], [1], b""))[1] == kind


def test_a_record_two_formats_claim_is_an_error() -> None:
    both = {"benchmarks": [], "load_summary": {"requested_rate": 1}, "successes": {}}
    with pytest.raises(BenchFormatError) as caught:
        detect_kind(Document(Path("x.json"), "json", [both], [1], b""))
    assert str(caught.value) == (
        "x.json: the record matches guidellm and inference-perf: cannot tell which wrote it"
    )


def test_unknown_format_fails_loudly(tmp_path: Path) -> None:
    bad = tmp_path / "mystery.json"
    bad.write_text(json.dumps({"latency": 3}))
    with pytest.raises(BenchFormatError) as caught:
        read_bench_files([bad], manifest=MANIFEST)
    message = str(caught.value)
    assert message.startswith(
        f"{bad}: unrecognised benchmark result (top-level keys ['latency']); "
        "formats tried and what each needs: aiperf profile_export_aiperf.json (time_to_first_token "
        "is an object with unit, and one of aiperf_version"
    )
    assert "; vLLM bench serve JSON or JSON Lines (a mean_ttft_ms, median_ttft_ms" in message
    csv = tmp_path / "data.csv"
    csv.write_text("a,b\n1,2\n")
    with pytest.raises(BenchFormatError, match=r"data\.csv"):
        read_bench_files([csv], manifest=MANIFEST)


# ---------------------------------------------------------------------------------------------
# manifests


def _tiny_vllm(path: Path, request_rate: float = 1.0) -> Path:
    path.write_text(
        json.dumps({"mean_ttft_ms": 1.0, "burstiness": 1.0, "request_rate": request_rate})
    )
    return path


def test_missing_manifest_names_file_and_keys(tmp_path: Path) -> None:
    f = _tiny_vllm(tmp_path / "run.json")
    with pytest.raises(BenchManifestError) as err:
        read_bench_files([f])
    msg = str(err.value)
    assert "run.json" in msg and "'engine'" in msg and "'gpu_type'" in msg and "'gpu_count'" in msg
    with pytest.raises(BenchManifestError, match=r"run\.json.*\['gpu_count'\]"):
        read_bench_files([f], manifest={"engine": "vllm", "gpu_type": "H100"})


def test_manifest_precedence_and_overrides(tmp_path: Path) -> None:
    sub = tmp_path / "runs"
    sub.mkdir()
    f = _tiny_vllm(sub / "a.json")
    g = _tiny_vllm(sub / "b.json", request_rate=2.0)  # another run (a copy is read once)
    # parent folder manifest applies to sub/…
    (tmp_path / "enginefit-bench.yaml").write_text(
        yaml.safe_dump(
            {
                **MANIFEST,
                "price_per_gpu_hour_usd": 2.5,
                "run_date": "2026-02-03",
                "files": {"b.*": {"engine_version": "0.9.1"}},
            }
        )
    )
    lp = read_bench_files([sub]).load_points
    assert lp.get_column("engine_version").to_list() == [None, "0.9.1"]
    assert lp.get_column("price_per_gpu_hour_usd").to_list() == [2.5, 2.5]
    assert [str(d) for d in lp.get_column("run_date").to_list()] == ["2026-02-03"] * 2
    # a per-file manifest beats the folder one; explicit keys beat both
    (sub / "a.json.manifest.yaml").write_text(
        yaml.safe_dump({"engine": "sglang", "gpu_type": "H200", "gpu_count": 8})
    )
    lp = read_bench_files([f, g], manifest={"quantization": "fp8"}).load_points
    assert lp.get_column("engine").to_list() == ["sglang", "vllm"]
    assert lp.get_column("gpu_count").to_list() == [8, 2]
    assert lp.get_column("quantization").to_list() == ["fp8", "fp8"]
    # the serving backend is read (lower case) and names the candidate
    lp = read_bench_files([f], manifest={"backend": "PyTorch"}).load_points
    assert lp.get_column("backend").to_list() == ["pytorch"]


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ({**MANIFEST, "gpus": 3}, r"unknown manifest key.*gpus"),
        ({**MANIFEST, "gpu_count": "two"}, r"gpu_count.*whole number from 1 to 100,000"),
        ({**MANIFEST, "gpu_count": 0}, r"gpu_count"),
        ({**MANIFEST, "price_per_gpu_hour_usd": -1}, r"price_per_gpu_hour_usd"),
        ({**MANIFEST, "run_date": "yesterday"}, r"run_date"),
        ({**MANIFEST, "backend": "py torch!"}, r"'backend' must be a backend name such as pytorch"),
        ({**MANIFEST, "backend": ["pytorch"]}, r"'backend' must be a string"),
        ([1, 2], r"must be a mapping"),
    ],
)
def test_bad_manifest(tmp_path: Path, content: Any, match: str) -> None:
    f = _tiny_vllm(tmp_path / "run.json")
    (tmp_path / "enginefit-bench.yaml").write_text(yaml.safe_dump(content))
    with pytest.raises(BenchManifestError, match=match):
        read_bench_files([f])


# ---------------------------------------------------------------------------------------------
# malformed result files


def test_truncated_json(tmp_path: Path) -> None:
    f = tmp_path / "profile_export_genai_perf.json"
    f.write_text(json.dumps({"time_to_first_token": {"unit": "ms", "avg": 1}}, indent=2)[:-10])
    with pytest.raises(BenchFormatError, match=r"profile_export_genai_perf\.json.*truncated"):
        read_bench_files([f], manifest=MANIFEST)


def test_truncated_jsonl_names_line(tmp_path: Path) -> None:
    line = json.dumps({"mean_ttft_ms": 1.0, "burstiness": 1.0, "request_rate": 1.0})
    f = tmp_path / "res.json"
    f.write_text(line + "\n" + line + "\n" + line[:25] + "\n")
    with pytest.raises(BenchFormatError, match=r"res\.json: line 3: not valid JSON"):
        read_bench_files([f], manifest=MANIFEST)


def test_string_where_number_belongs(tmp_path: Path) -> None:
    good = {"mean_ttft_ms": 1.0, "burstiness": 1.0, "request_rate": 1.0}
    f = tmp_path / "res.jsonl"
    f.write_text(json.dumps(good) + "\n" + json.dumps({**good, "p99_ttft_ms": "fast"}) + "\n")
    with pytest.raises(BenchFieldError, match=r"res\.jsonl: line 2: field 'p99_ttft_ms'.*'fast'"):
        read_bench_files([f], manifest=MANIFEST)
    g = tmp_path / "stage_0_lifecycle_metrics.json"
    g.write_text(
        json.dumps(
            {
                "load_summary": {"requested_rate": 1.0, "count": 1},
                "successes": {"count": "many", "latency": {}},
                "failures": {"count": 0},
            }
        )
    )
    with pytest.raises(BenchFieldError, match=r"stage_0.*stage 0.*successes\.count"):
        read_bench_files([g], manifest=MANIFEST)


def test_bad_per_request_arrays(tmp_path: Path) -> None:
    rec = vllm_record(np.random.default_rng(1), 5, 0)
    rec["itls"] = rec["itls"][:-1]
    f = tmp_path / "r.json"
    f.write_text(json.dumps(rec))
    with pytest.raises(BenchFieldError, match=r"field 'itls': has 4 entries but 'ttfts' has 5"):
        read_bench_files([f], manifest=MANIFEST)
    rec = vllm_record(np.random.default_rng(1), 5, 0)
    rec["itls"][2] = [0.1, "x"]
    f.write_text(json.dumps(rec))
    with pytest.raises(BenchFieldError, match=r"itls\[2\]\[1\]"):
        read_bench_files([f], manifest=MANIFEST)


def test_unknown_keys_are_dropped_not_fatal(tmp_path: Path) -> None:
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"mean_ttft_ms": 1.0, "burstiness": 1.0, "whatever_new": [1, 2]}))
    r = read_bench_files([f], manifest=MANIFEST).load_points.row(0, named=True)
    assert r["file_metadata"] is None  # not on the vLLM allowlist: may be content
    assert r["row_notes"] == [
        "1 free-form key(s) not kept (not on the reader's allowlist, or not a short value; a "
        "result file may carry prompts): whatever_new"
    ]


def test_guidellm_unknown_strategy_and_g1(tmp_path: Path) -> None:
    f = tmp_path / "b.json"
    bench = {"type_": "generative_benchmark", "config": {"strategy": {"type_": "warp"}}}
    f.write_text(json.dumps({"benchmarks": [{**bench, "scheduler_metrics": {}, "metrics": {}}]}))
    with pytest.raises(BenchFieldError, match=r"benchmarks\[0\].*strategy.*warp"):
        read_bench_files([f], manifest=MANIFEST)
    f.write_text(json.dumps({"benchmarks": [{"benchmarks": [{"mode": "warp"}], "args": {}}]}))
    with pytest.raises(BenchFieldError, match=r"benchmarks\[0\]\.benchmarks\[0\].*mode.*warp"):
        read_bench_files([f], manifest=MANIFEST)


def test_guidellm_g1_recomputed_from_raw_results(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    results: list[dict[str, Any]] = []
    for k in range(12):
        start = 1_720_000_000.0 + k * 0.5
        first = float(rng.uniform(0.05, 0.2))
        gaps = [float(x) for x in rng.uniform(0.01, 0.03, int(rng.integers(2, 9)))]
        results.append(
            {
                "start_time": start,
                "end_time": start + first + sum(gaps),
                "first_token_time": first,
                "decode_times": {"data": gaps},
                "prompt_token_count": 100,
                "output_token_count": len(gaps) + 1,
                "prompt": "never kept",
            }
        )
    doc = {
        "benchmarks": [
            {
                "args": {"model": "old/model", "rate_type": "poisson"},
                "benchmarks": [
                    {"mode": "asynchronous", "rate": 2.0, "results": results, "errors": [{}]},
                    {"mode": "synchronous", "rate": None, "results": results[:3], "errors": []},
                ],
            }
        ]
    }
    f = tmp_path / "report.json"
    f.write_text(json.dumps(doc))
    lp = read_bench_files([f], manifest=MANIFEST).load_points.sort("record_index")
    r = lp.row(0, named=True)
    assert (r["source_schema"], r["load_mode"], r["arrival_process"]) == (
        "guidellm-G1",
        "open",
        "poisson",
    )
    assert (r["offered_rate_rps"], r["completed"], r["failed"], r["model"]) == (
        2.0,
        12,
        1,
        "old/model",
    )
    ttft = np.array([x["first_token_time"] for x in results]) * 1000
    all_gaps = np.concatenate([x["decode_times"]["data"] for x in results]) * 1000
    e2e = np.array([x["end_time"] - x["start_time"] for x in results]) * 1000
    assert close(r["ttft_p95_ms"], float(np.percentile(ttft, 95)))
    assert close(r["itl_p99_ms"], float(np.percentile(all_gaps, 99)))  # per-gap, recoverable in G1
    assert close(r["e2e_p50_ms"], float(np.percentile(e2e, 50)))
    assert r["itl_source"] == "recomputed" and r["tpot_definition"] == "decode_per_request"
    assert lp.row(1, named=True)["load_mode"] == "closed"


def test_empty_and_binary_files(tmp_path: Path) -> None:
    e = tmp_path / "empty.json"
    e.write_text("  \n")
    with pytest.raises(BenchFormatError, match="empty file"):
        read_bench_files([e], manifest=MANIFEST)
    b = tmp_path / "blob.json"
    b.write_bytes(b"\xff\xfe\x00\x01")
    with pytest.raises(BenchFormatError, match=r"blob\.json: not a text file"):
        read_bench_files([b], manifest=MANIFEST)
    with pytest.raises(BenchFormatError, match="no such"):
        read_bench_files([tmp_path / "nope.json"], manifest=MANIFEST)


# ---------------------------------------------------------------------------------------------
# the percentile method itself


def test_recompute_stats_matches_numpy() -> None:
    rng = np.random.default_rng(11)
    rows: list[dict[str, Any]] = []
    for point in ("a", "b"):
        for i in range(int(rng.integers(5, 40))):
            ok = bool(rng.random() > 0.1)
            out = int(rng.integers(0, 30))
            rows.append(
                {
                    "point_id": point,
                    "ok": ok,
                    "ttft_ms": float(rng.uniform(1, 100)) if i % 7 else None,
                    "e2e_ms": float(rng.uniform(100, 900)),
                    "tpot_ms": float(rng.uniform(1, 5)) if out > 1 else None,
                    "itl_ms": [float(x) for x in rng.uniform(1, 9, max(out - 1, 0))],
                    "input_tokens": int(rng.integers(1, 50)),
                    "output_tokens": out,
                }
            )
    frame = pl.DataFrame(rows, schema_overrides={"itl_ms": pl.List(pl.Float64)})
    stats = recompute_stats(frame)
    for point in ("a", "b"):
        sub = [r for r in rows if r["point_id"] == point and r["ok"]]
        got = stats.filter(pl.col("point_id") == point).row(0, named=True)
        ref = {
            "ttft": np.array([r["ttft_ms"] for r in sub if r["ttft_ms"] is not None]),
            "e2e": np.array([r["e2e_ms"] for r in sub]),
            "tpot": np.array([r["tpot_ms"] for r in sub if r["tpot_ms"] is not None]),
            "itl": np.array([g for r in sub for g in r["itl_ms"]]),
        }
        for metric, x in ref.items():
            assert got[f"{metric}_n"] == len(x)
            for q in (50, 90, 95, 99):
                assert close(got[f"{metric}_p{q}_ms"], float(np.percentile(x, q)))
            assert close(got[f"{metric}_mean_ms"], float(x.mean()))
        toks = np.array([r["output_tokens"] for r in sub])
        assert close(got["output_tokens_p99"], float(np.percentile(toks, 99)))
        assert got["output_tokens_fixed"] == bool(toks.min() == toks.max())


# ---------------------------------------------------------------------------------------------
# SGLang eras, guidellm strategies, vLLM sweep folders


def test_sglang_late_2025_and_refactor_eras(tmp_path: Path) -> None:
    late = {
        "backend": "sglang-oai",
        "dataset_name": "sharegpt",
        "request_rate": "trace",
        "max_concurrency": 64,
        "tag": "radix-on",
        "server_info": {"model_path": "meta-llama/L-8B", "version": "0.5.9"},
        "duration": 10.0,
        "completed": 100,
        "total_input_tokens": 5000,
        "total_output_tokens": 2000,
        "total_throughput": 700.0,
        "request_throughput": 10.0,
        "median_ttft_ms": 30.0,
        "p99_ttft_ms": 90.0,
        "p95_itl_ms": 11.0,
    }
    rng = np.random.default_rng(5)
    base = vllm_record(rng, 12, 1)
    refactor = {
        "backend": "sglang",
        "dataset_name": "random",
        "request_rate": 4.0,
        "max_concurrency": None,
        "random_input_len": 100,
        "random_output_len": 50,
        "random_range_ratio": 0.5,
        "duration": 3.0,
        "completed": 11,
        "total_input": 1100,
        "total_output": 550,
        "median_ttft_ms": 1.0,
        "max_itl_ms": 77.0,
        "details": {k: base[k] for k in ("input_lens", "output_lens", "ttfts", "itls", "errors")},
    }
    f = tmp_path / "sg.jsonl"
    f.write_text(json.dumps(late) + "\n" + json.dumps(refactor) + "\n")
    lp = read_bench_files([f], manifest=MANIFEST).load_points.sort("record_index")
    a, b = lp.row(0, named=True), lp.row(1, named=True)
    assert (a["source_schema"], a["label"], a["model"]) == (
        "sglang-late-2025",
        "radix-on",
        "meta-llama/L-8B",
    )
    assert (a["arrival_process"], a["offered_rate_rps"], a["concurrency"]) == ("trace", None, 64)
    assert a["itl_p95_ms"] == 11.0 and a["ttft_p99_ms"] == 90.0
    assert close(a["input_tokens_per_s"], 5000 / 10.0)  # derived: total_input_tokens / duration
    assert json.loads(a["file_metadata"])["server_info.version"] == "0.5.9"
    assert b["source_schema"] == "sglang-refactor"
    assert (b["total_input_tokens"], b["total_output_tokens"]) == (1100, 550)
    assert (b["failed"], b["num_requests"]) == (1, 12)  # from details.errors
    ref = numpy_reference(refactor, "details")
    assert close(b["itl_max_ms"], float(ref["itl"].max()))  # recomputed beats max_itl_ms
    assert json.loads(b["native_stats"])["itl_max_ms"] == 77.0


def _g3_bench(strategy: dict[str, Any], ttft_p95: float) -> dict[str, Any]:
    def dist(mean: float, p95: float) -> dict[str, Any]:
        return {
            "successful": {
                "mean": mean,
                "median": mean,
                "min": 1.0,
                "max": p95 * 2,
                "count": 10,
                "total_sum": mean * 10,
                "percentiles": {"p50": mean, "p90": p95 * 0.9, "p95": p95, "p99": p95 * 1.1},
            }
        }

    return {
        "type_": "generative_benchmark",
        "config": {"strategy": strategy, "backend": {"model": "m"}, "profile": {}},
        "scheduler_metrics": {},
        "start_time": 1760000000.0,
        "duration": 60.0,
        "metrics": {
            "request_totals": {"successful": 10, "errored": 1, "incomplete": 2, "total": 13},
            "time_to_first_token_ms": dist(50.0, ttft_p95),
            "inter_token_latency_ms": dist(8.0, 12.0),
            "request_latency": dist(1.5, 2.0),
            "output_tokens_per_second": dist(300.0, 350.0),
            "requests_per_second": dist(0.2, 0.3),
            "prompt_token_count": dist(128.0, 128.0),
        },
    }


def test_guidellm_g3_strategies(tmp_path: Path) -> None:
    doc = {
        "args": {"model": "m", "profile": "sweep"},
        "benchmarks": [
            _g3_bench({"type_": "synchronous"}, 40.0),
            _g3_bench({"type_": "concurrent", "streams": 16}, 60.0),
            _g3_bench({"type_": "throughput", "max_concurrency": 512}, 900.0),
            _g3_bench({"type_": "poisson", "rate": 3.5}, 70.0),
        ],
    }
    f = tmp_path / "benchmarks.json"
    f.write_text(json.dumps(doc))
    lp = read_bench_files([f], manifest=MANIFEST).load_points.sort("record_index")
    assert (lp.get_column("source_schema") == "guidellm-G3").all()
    assert lp.get_column("load_mode").to_list() == ["closed", "closed", "offline", "open"]
    assert lp.get_column("concurrency").to_list() == [1, 16, 512, None]
    offered = lp.get_column("offered_rate_rps").to_list()
    assert offered[:2] == [None, None] and math.isinf(offered[2]) and offered[3] == 3.5
    assert lp.get_column("ttft_p95_ms").to_list() == [40.0, 60.0, 900.0, 70.0]
    r = lp.row(0, named=True)
    assert (r["completed"], r["failed"], r["incomplete"]) == (10, 1, 2)
    assert close(r["error_rate"], 1 / 11)
    assert r["e2e_p95_ms"] == 2000.0  # request_latency seconds × 1000
    assert str(r["run_date"]) == "2025-10-09"  # start_time epoch 1760000000 UTC
    assert r["input_len_fixed"] is False  # min 1 != max 256


def test_vllm_sweep_folder_skips_summary(tmp_path: Path) -> None:
    run = tmp_path / "exp" / "SERVE--BENCH-max_concurrency=4"
    run.mkdir(parents=True)
    rec = {"mean_ttft_ms": 1.0, "burstiness": 1.0, "request_rate": "inf", "max_concurrency": 4}
    for k in range(2):
        (run / f"run={k}.json").write_text(json.dumps({**rec, "run_number": k}, indent=4))
    (run / "summary.json").write_text(json.dumps([rec, rec]))
    (run / "summary.csv").write_text("a,b\n")
    write_manifest(tmp_path)
    result = read_bench_files([tmp_path / "exp"])
    assert result.load_points.height == 2
    assert (result.load_points.get_column("load_mode") == "closed").all()
    assert any("summary.json" in n and "sweep" in n for n in result.notes)
    assert any("summary.csv" in n and "skipped" in n for n in result.notes)


def test_aiperf_010_phases_and_genai_perf_rate_stimulus(tmp_path: Path) -> None:
    doc = aiperf_doc({"unit": "ms", "avg": 8.0, "p99": 30.0})
    doc["input_config"] = {
        "models": {"items": [{"name": "q/model"}]},
        "phases": [
            {"name": "warmup", "type": "concurrency", "exclude_from_results": True},
            {"name": "profiling", "type": "poisson", "rate": 1.2, "requests": 100},
        ],
    }
    a = tmp_path / "a"
    a.mkdir()
    (a / "profile_export_aiperf.json").write_text(json.dumps(doc))
    g = tmp_path / "g"
    g.mkdir()
    genai = {
        "time_to_first_token": {"unit": "ms", "avg": 5.0, "p95": 9.0},
        "request_count": {"unit": "count", "avg": 10},
        "request_throughput": {"unit": "requests/sec", "avg": 0.5},
        "input_config": {
            "model_names": ["x"],
            "endpoint": {"type": "chat", "backend": "tensorrtllm"},
            "perf_analyzer": {"stimulus": {"request_rate": 0.5}},
        },
    }
    (g / "profile_export_genai_perf.json").write_text(json.dumps(genai))
    lp = read_bench_files([a, g], manifest=MANIFEST).load_points
    ra = lp.filter(pl.col("tool") == "aiperf").row(0, named=True)
    assert (ra["load_mode"], ra["arrival_process"], ra["offered_rate_rps"]) == (
        "open",
        "poisson",
        1.2,
    )
    rg = lp.filter(pl.col("tool") == "genai_perf").row(0, named=True)
    assert (rg["load_mode"], rg["offered_rate_rps"], rg["concurrency"]) == ("open", 0.5, None)
    assert close(rg["duration_s"], 10 / 0.5)  # derived: request_count / request_throughput
    assert rg["ttft_p95_ms"] == 9.0 and rg["tpot_source"] == "missing"


def test_manifest_numbers_in_yaml_1_2_form(tmp_path: Path) -> None:
    """A sidecar's ``1e-9`` is a number (YAML 1.2), not the text PyYAML's YAML 1.1 made of it."""
    run = _tiny_vllm(tmp_path / "run.json")
    (tmp_path / "enginefit-bench.yaml").write_text(
        "engine: vllm\ngpu_type: H100\ngpu_count: 1\nprice_per_gpu_hour_usd: 1e-9\n"
    )
    points = read_bench_files([run]).load_points
    assert points["price_per_gpu_hour_usd"].to_list() == [1e-9]
