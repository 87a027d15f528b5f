"""Hostile what-if scenarios: whatever a scenario changes is said in its own unit (an SLO in
the milliseconds its keys name, never in dollars an hour)."""

from __future__ import annotations

from pipeline.whatif.present import changes_text


def test_a_scenario_slo_is_never_labelled_in_dollars() -> None:
    assert changes_text({"slo": {"ttft_p95_ms": 500, "itl_p99_ms": 62.5}}) == (
        "slo ttft_p95_ms 500, itl_p99_ms 62.5"
    )
    assert changes_text({"gpu_hour_usd": {"H100": 2.5}, "traffic_scale": 2.0}) == (
        "gpu hour usd H100 $2.5/h, traffic scale 2"
    )
