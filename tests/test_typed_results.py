"""Typed stage results: each written document reads back as the same model and writes the same
bytes, and a figure the input cannot support is ``Unknown`` with its reason in memory while the
file keeps ``null`` beside the reason key it always had."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl

from pipeline.prefix.analysis import analyse
from pipeline.prefix.result import PrefixResult
from pipeline.schema import conform
from pipeline.shape.compute import compute_shape
from pipeline.shape.result import ShapeResult
from pipeline.sim.blocks import NO_CONTENT, sim_input
from pipeline.sim.config import Scenario
from pipeline.sim.replay import simulate, summarise
from pipeline.sim.result import ScenarioSummary
from pipeline.store import json_bytes
from pipeline.unknown import Unknown, is_known
from tests.conftest import DEFAULTS
from tests.workloads import growing_conversations

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def _scenario(frame: pl.DataFrame) -> dict[str, Any]:
    inp = sim_input(frame, latency_model=DEFAULTS.shape.latency)
    settings = DEFAULTS.simulation
    return summarise(inp, simulate(inp, Scenario(16, 2, 64, "round-robin"), settings))


def test_scenario_summary_round_trips_byte_identical() -> None:
    raw = _scenario(growing_conversations(12, 3, extra_tokens=1, output_tokens=4))
    summary = ScenarioSummary.from_json(raw)
    assert is_known(summary.hit_ratio) and raw["hit_unknown_reason"] is None
    assert json_bytes(summary.to_json()) == json_bytes(raw)
    back = ScenarioSummary.from_json(json.loads(json_bytes(summary.to_json())))
    assert back == summary


def test_scenario_without_content_has_unknown_hits_with_the_reason() -> None:
    frame = growing_conversations(12, 3, extra_tokens=1, output_tokens=4).with_columns(
        pl.lit(False).alias("hashes_known"),
        pl.lit([], pl.List(pl.UInt64)).alias("prefix_hashes"),
        pl.lit(0).alias("prompt_blocks"),
    )
    raw = _scenario(frame)
    summary = ScenarioSummary.from_json(raw)
    assert summary.hit_ratio == Unknown(reason=NO_CONTENT)
    assert summary.hit_tokens == summary.prefill_tokens == Unknown(reason=NO_CONTENT)
    written = summary.to_json()
    assert written["hit_ratio"] is None and written["hit_unknown_reason"] == NO_CONTENT
    assert json_bytes(written) == json_bytes(raw)


def test_prefix_summary_round_trips_byte_identical() -> None:
    result = analyse(growing_conversations(12, 3, extra_tokens=1, output_tokens=4), DEFAULTS.prefix)
    written = json_bytes(result.to_json())
    back = PrefixResult.from_json(json.loads(written), result.curve, result.sessions)
    assert back.summary == result.summary
    assert json_bytes(back.to_json()) == written


def _quantised_trace(n: int = 120) -> pl.DataFrame:
    """Arrivals on a 3 s grid: the 1 s and 10 s windows and the inter-arrival CV are unknown."""
    return conform(
        pl.DataFrame(
            {
                "request_id": [f"r{i}" for i in range(n)],
                "arrival": [T0 + timedelta(seconds=3 * (i // 2)) for i in range(n)],
                "prompt_tokens": [(i * 37) % 3000 + 1 for i in range(n)],
                "output_tokens": [(i * 13) % 400 + 1 for i in range(n)],
            }
        )
    )


def test_shape_metrics_round_trip_and_unsupported_statistics_are_unknown() -> None:
    result = compute_shape(_quantised_trace(), DEFAULTS.shape)
    written = json_bytes(result.to_json())
    back = ShapeResult.from_json(json.loads(written))
    assert back.metrics == result.metrics
    assert json_bytes(back.to_json()) == written
    arrivals = back.metrics.arrivals
    one_second = arrivals.windows["1s"]
    assert isinstance(one_second, Unknown) and "quantised" in one_second.reason
    assert isinstance(arrivals.inter_arrival, Unknown)
    assert isinstance(back.metrics.sessions, Unknown)
    assert isinstance(back.metrics.provider_cache, Unknown)
    on_disk = json.loads(written)
    assert on_disk["arrivals"]["windows"]["1s"] == {
        "supported": False,
        "reason": one_second.reason,
        "window_s": 1,
    }
    assert on_disk["sessions"] == {"known": False, "reason": "no session_id logged"}
    assert "1s" not in back.facts.peak_rate_rps
