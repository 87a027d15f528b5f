"""Findings thresholds and the `shape` config section."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.config import config_from_mapping
from pipeline.errors import ConfigError
from pipeline.shape.config import ShapeConfig
from pipeline.shape.facts import LatencyModel
from pipeline.shape.findings import place_on_axes
from tests.conftest import DEFAULTS


def shape(
    peak: int, out: tuple[float, float], prompt: tuple[float, float], estimated: bool = False
) -> dict[str, Any]:
    def dist(p50: float, p99: float) -> dict[str, Any]:
        ratio = p99 / p50 if p50 else None
        return {"count": 10, "p50": p50, "p99": p99, "max": p99, "p99_over_p50": ratio}

    return {
        "concurrency": {
            "peak": peak,
            "mean": 1.0,
            "estimated": estimated,
            "latency_model": DEFAULTS.shape.latency.as_dict() if estimated else None,
        },
        "lengths": {"output_tokens": dist(*out), "prompt_tokens": dist(*prompt)},
        "arrivals": {
            "quantisation": {"quantised": False},
            "windows": {"1s": {"supported": True, "window_s": 1, "index_of_dispersion": 1.0}},
            "inter_arrival": {"supported": True, "cv": 1.0},
        },
    }


def ids(s: dict[str, Any], cfg: ShapeConfig | None = None) -> list[str]:
    return [f.id for f in place_on_axes(s, cfg or DEFAULTS.shape)]


@pytest.mark.parametrize(
    ("peak", "expected"),
    [(0, "low"), (2, "low"), (3, "moderate"), (9, "moderate"), (10, "high"), (500, "high")],
)
def test_concurrency_regimes(peak: int, expected: str) -> None:
    assert ids(shape(peak, (10, 10), (10, 10)))[0] == f"concurrency.{expected}"


def test_tail_threshold_is_inclusive() -> None:
    found = ids(shape(5, (100, 400), (100, 399)))
    assert "output_tail.long" in found and "prompt_tail.short" in found
    assert "prompt_tail.long" in ids(
        shape(5, (1, 1), (100, 399)), DEFAULTS.shape.replace(long_tail_ratio=3)
    )


def test_unknown_output_and_zero_median() -> None:
    s = shape(5, (0, 5), (10, 10))
    assert "output_tail.long" in ids(s)  # p50 = 0 < p99: infinitely long tail
    s["lengths"]["output_tokens"] = {"count": 0, "p50": None, "p99": None, "p99_over_p50": None}
    assert "output_tail.unknown" in ids(s)


def test_findings_carry_numbers_and_estimate_flag() -> None:
    fs = place_on_axes(shape(12, (10, 100), (10, 10), estimated=True), DEFAULTS.shape)
    conc = fs[0]
    assert conc.estimated and conc.numbers["peak_concurrency"] == 12
    assert conc.numbers["latency_model"]["tpot_ms"] == 30.0 and "estimated" in conc.message
    tail = fs[1]
    assert tail.numbers["p99_over_p50"] == 10 and tail.numbers["threshold"] == 4.0
    assert not tail.estimated


def test_bursty_and_quantised_findings() -> None:
    s = shape(5, (1, 1), (1, 1))
    s["arrivals"]["inter_arrival"]["cv"] = 2.5
    s["arrivals"]["quantisation"] = {
        "quantised": True,
        "quantum_s": 3.0,
        "distinct_timestamps": 9,
        "tie_share": 1.0,
    }
    found = {f.id: f for f in place_on_axes(s, DEFAULTS.shape)}
    assert found["arrivals.bursty"].numbers["inter_arrival_cv"] == 2.5
    assert found["timestamps.quantised"].numbers["quantum_s"] == 3.0
    s["arrivals"]["inter_arrival"]["cv"] = 1.9
    assert "arrivals.bursty" not in ids(s)


def test_config_values_replace_defaults() -> None:
    cfg = config_from_mapping(
        {"shape": {"latency_model": {"tpot_ms": 12, "ttft_base_ms": 0}, "long_tail_ratio": 5}}
    ).shape
    assert cfg.latency == LatencyModel(
        ttft_base_ms=0.0,
        ttft_per_prompt_token_ms=DEFAULTS.shape.latency.ttft_per_prompt_token_ms,
        tpot_ms=12.0,
    )
    assert cfg.long_tail_ratio == 5.0


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            {"long_tail_ratoi": 4},
            "unknown key shape.long_tail_ratoi (did you mean long_tail_ratio?)",
        ),
        ({"latency_model": {"tpot": 3}}, "unknown key shape.latency_model.tpot"),
        (
            {"latency_model": {"tpot_ms": -1}},
            "shape.latency_model.tpot_ms: Input should be greater",
        ),
        ({"latency_model": {"tpot_ms": "fast"}}, "Input should be a valid number"),
        ({"latency_model": [1]}, "shape.latency_model: Input should be a valid dictionary"),
        ({"long_tail_ratio": 1}, "shape.long_tail_ratio: Input should be greater than 1"),
        ({"plot_points": 500}, "unknown key shape.plot_points"),
    ],
)
def test_config_errors_name_the_key(section: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_mapping({"shape": section})
    assert message in str(caught.value)


def test_features_finding() -> None:
    s = shape(5, (1, 1), (1, 1))
    assert "features.none" in ids(s)
    s["features"] = {
        "structured_output": {"share_of_logged": 0.25},
        "tools": {"share_of_logged": None},
        "lora_adapter": {"share": 0.0, "distinct_adapters": 0},
    }
    s["lengths"]["long_context"] = {">=32768": {"requests": 1, "share": 0.1}}
    found = {f.id: f for f in place_on_axes(s, DEFAULTS.shape)}
    f = found["features.seen"]
    assert f.numbers["structured_output_share"] == 0.25
    assert f.numbers["long_context_32k_share"] == 0.1
    assert "structured output 25.0%" in f.message and "prompts ≥ 32k tokens 10.0%" in f.message
    assert "not logged: tools" in f.message and "LoRA" not in f.message
