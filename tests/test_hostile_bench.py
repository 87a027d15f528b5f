"""Hostile benchmark results: a point whose latency no run can produce (a p95 TTFT of ``inf``)
is unknown, and every sentence about the sweep agrees with the capacity table."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.test_bench_cli import run_json as bench_json
from tests.test_bench_hostile import vllm_point, write_result


def test_an_infinite_ttft_above_the_last_pass_never_raises_the_lower_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "r"
    for i, (rate, ttft) in enumerate([(1.0, 80.0), (8.0, math.inf)]):
        point = vllm_point(
            request_rate=rate,
            duration=200 / rate,
            request_throughput=rate * 0.995,
            output_throughput=rate * 99.5,
            total_token_throughput=rate * 199,
            p95_ttft_ms=ttft,
        )
        write_result(folder, point, name=f"run{i}.json")
    payload = bench_json(capsys, str(folder), "--gpu-hour-usd", "2")
    (cap,) = payload["capacity"]
    assert cap["capacity_status"] == "not_bracketed"
    assert cap["capacity_load"] == 1.0
    assert cap["note"].split("; ") == [
        "no failure seen: capacity is at least 1",
        "unknown points at 8 above the capacity: the true capacity may be higher",
    ]
