"""The document's words: one rounding rule for counts, requirements and load points as a reader
says them, and figures no wider than their small text allows in print."""

from __future__ import annotations

import pytest

from pipeline.present.figures import MAX_WIDTH_IN, SMALL_FONT, drawing
from pipeline.present.text import measurement, quantity, sample_rate
from pipeline.report.sections.bench import load_points_text
from pipeline.report.sections.requirements import requirement_value
from tests.decision_fixtures import LLAMA_8B_ON_H100


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (3_062_693_019, "3.06 billion"),
        (3_062_690_000.0, "3.06 billion"),  # the record's 6-digit rounding reads the same
        (12_345_678, "12.3 million"),
        (1_000_000, "1 million"),
        (85_401, "85,401"),
        (999_999.4, "999,999"),
        (2.5e12, "2.5 trillion"),
    ],
)
def test_counts_have_one_rounding_rule(value: float, text: str) -> None:
    assert quantity(value) == text
    assert measurement(value) == text


def test_small_and_mid_values_stay_plain() -> None:
    assert measurement(8.54e4) == "85,400"  # never 8.54e+04
    assert measurement(0.0001234) == "0.0001234"
    assert measurement(0.5713) == "0.5713"
    assert measurement(75) == "75"
    assert measurement(True) == "True"  # a flag is not a count


def test_requirements_read_as_words() -> None:
    assert requirement_value("fixed_sku", False) == "no"
    assert requirement_value("untrusted_tenants", True) == "yes"
    assert requirement_value("hardware", ["nvidia", "amd"]) == "nvidia, amd"
    assert requirement_value("cost_margin", 0.1) == "10%"
    assert requirement_value("engineer_week_usd", 6000.0) == "$6,000"
    assert requirement_value("current_engine", None) == "unknown (not stated)"
    assert requirement_value("migration_engineer_weeks", {"vllm": 2.0}) == "vllm: 2"
    # Llama-3.1-8B on one H100: about 450k tokens (pipeline.decision.config.KvCacheSizing).
    kv = {**LLAMA_8B_ON_H100, "attention_heads": 32}
    assert requirement_value("kv_cache", kv) == (
        "8.03 B parameters at 2 bytes each, 32 layers, 8 KV heads of 128, on 1 × 79.2 GiB GPU(s) "
        "at 92% use: 449,797 tokens"
    )


def test_load_points_in_words() -> None:
    pattern = "1:? 31.4:P 61.79:P 92.19:P 122.59:F 152.98:F"
    assert load_points_text(pattern) == (
        "not judged at 1 req/s; passed at 31.4, 61.79, 92.19 req/s; failed at 122.59, 152.98 req/s"
    )
    assert load_points_text(None) == "—"


def test_no_figure_is_wider_than_its_small_text_allows() -> None:
    # 8 pt text on a 7.5-inch figure printed across the 176-mm A4 column is ≥ 7 pt.
    assert SMALL_FONT * 176 / (MAX_WIDTH_IN * 25.4) >= 7.0
    with pytest.raises(ValueError, match="prints its small text below 7 pt"), drawing(9, 3):
        pass


@pytest.mark.parametrize(
    ("rate", "text"),
    [
        (0.3912, "39.12%"),
        (0.01, "1.00%"),
        (0.0098765, "0.99%"),
        (0.000034, "0.0034%"),
        (0.0, "0.00%"),
    ],
)
def test_a_tiny_sample_rate_never_reads_as_zero(rate: float, text: str) -> None:
    assert sample_rate(rate) == text
