"""The costing module against hand-computed figures, and the guard that keeps it the only place
a price precedence or the hours in a month are written."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest

from pipeline.capacity.result import WorkloadCost
from pipeline.costing import (
    DEFAULT_PRICE_LABEL,
    FLEET_FORMULA,
    HOURS_PER_MONTH,
    Prices,
    fractional_replicas,
    monthly_usd,
    parallel_run_usd,
    payback_months,
    per_million,
    prices_from_mapping,
    replicas_for,
)
from pipeline.decision.evidence import _monthly_at
from pipeline.errors import ConfigError
from pipeline.report.sections.requirements import requirements
from tests.conftest import REPO

PRICES = Prices(gpu_hour_usd={"H100": 3.0, "L40S": 1.2}, default=2.0)


def test_price_precedence_override_type_manifest_default() -> None:
    # The configured type beats the manifest, which beats the default.
    assert PRICES.price_for("NVIDIA-H100-80GB", 9.0) == (3.0, "config gpu_hour_usd.H100")
    assert PRICES.price_for("A100", 1.5) == (1.5, "manifest price_per_gpu_hour_usd")
    assert PRICES.price_for("MI300X", None) == (2.0, "config gpu_hour_usd.default")
    assert PRICES.price_for(None, None) == (2.0, "config gpu_hour_usd.default")
    assert Prices().price_for("H100", None) == (None, "no price")
    overridden = Prices(gpu_hour_usd={"H100": 3.0}, default=2.0, override=0.5)
    assert overridden.price_for("H100", 9.0) == (0.5, "--gpu-hour-usd")


def test_gpu_name_matching() -> None:
    prices = Prices(gpu_hour_usd={"H100": 3.0, "H100 NVL": 3.5, "l40s": 1.2})
    assert prices.price_for("h100-nvl", None) == (3.5, "config gpu_hour_usd.H100 NVL")
    assert prices.price_for("4xNVIDIA_L40S", None) == (1.2, "config gpu_hour_usd.l40s")
    assert prices.price_for("NVIDIA H100 80GB HBM3", None) == (3.0, "config gpu_hour_usd.H100")
    assert prices.price_for("A10G", None) == (None, "no price")


def test_prices_from_mapping() -> None:
    assert prices_from_mapping({"gpu_hour_usd": 2.5}) == Prices(default=2.5)
    parsed = prices_from_mapping({"gpu_hour_usd": {"H100": 3, "default": 1}})
    assert parsed == Prices(gpu_hour_usd={"H100": 3.0}, default=1.0)
    assert prices_from_mapping(None) == Prices()
    for bad, message in [
        (
            {"gpu_hour_usd": {"H100": "cheap"}},
            "bench.prices.gpu_hour_usd.H100: must be a price in $ per GPU-hour, got 'cheap'",
        ),
        ({"gpu_hour_usd": {"H100": -1}}, "bench.prices.gpu_hour_usd.H100: a price is 0 to 1000 "),
        ({"gpu_hour_usd": True}, "bench.prices.gpu_hour_usd: must be a price in $ per GPU-hour"),
        ({"usd": 1}, "bench.prices: unknown key(s) ['usd']; expected gpu_hour_usd"),
        ([1, 2], "bench.prices: must be a mapping with key gpu_hour_usd"),
    ]:
        with pytest.raises(ConfigError) as info:
            prices_from_mapping(bad)
        assert str(info.value).startswith(message)


def test_configured_rows_include_the_default() -> None:
    assert PRICES.configured_rows() == [("H100", 3.0), ("L40S", 1.2), (DEFAULT_PRICE_LABEL, 2.0)]
    assert Prices(default=2.5).configured_rows() == [(DEFAULT_PRICE_LABEL, 2.5)]
    assert Prices().configured_rows() == []


def test_report_price_table_lists_the_configured_default() -> None:
    """The document's price table shows every configured price, the default included (it
    prices any GPU type neither listed nor priced by its manifest)."""
    content = SimpleNamespace(record=SimpleNamespace(requirements={}), slo="", prices=PRICES)
    assert [p.model_dump() for p in requirements(content).prices] == [  # type: ignore[arg-type]
        {"gpu": "H100", "price": "$3.00/GPU-hour"},
        {"gpu": "L40S", "price": "$1.20/GPU-hour"},
        {
            "gpu": "default (a GPU type not listed whose manifest gives no price)",
            "price": "$2.00/GPU-hour",
        },
    ]


def test_replicas_by_hand() -> None:
    assert replicas_for(250.0, 100.0) == 3  # ceil(2.5)
    assert replicas_for(92.19, 92.19) == 1  # exactly one replica's capacity
    assert 2.1 / 0.7 == 3.0000000000000004  # a hair above 3 in binary floating point ...
    assert replicas_for(2.1, 0.7) == 3  # ... is 3 replicas, not 4
    assert replicas_for(80.0, 100.0, headroom=0.8) == 1  # 80 ÷ (100 × 0.8) = 1
    assert replicas_for(81.0, 100.0, headroom=0.8) == 2
    assert replicas_for(81.0, 100.0, headroom=0.8, spare=True) == 3
    assert replicas_for(1e-12, 100.0) == 1  # any traffic needs one replica
    assert fractional_replicas(50.0, 100.0, 0.5, spare=True) == 2.0  # 50 ÷ 50 + 1 spare


def test_money_by_hand() -> None:
    assert monthly_usd(6, 3.0) == 6 * 3.0 * 730 == 13_140
    # docs/decision-rules.md#cost-formula: $3.00/h at 2,500 tok/s → $0.33 per 1M
    assert round(per_million(3.0, 2500 * 3600.0), 2) == 0.33
    both = pl.select(per_million(pl.lit(3.0), pl.lit(2500 * 3600.0))).item()
    assert both == per_million(3.0, 2500 * 3600.0)  # one formula for floats and frames
    assert parallel_run_usd(1000.0, 730 / 168) == pytest.approx(1000.0)  # one month of weeks
    assert payback_months(12_000.0, 1_000.0) == 12.0
    assert payback_months(12_000.0, 0.0) is None  # no saving: never
    assert payback_months(12_000.0, -5.0) is None
    assert FLEET_FORMULA.endswith("monthly_usd = gpus × $/GPU-hour × 730 h")


def _cost(replicas: int, gpus: int, headroom: float) -> WorkloadCost:
    return WorkloadCost(
        replicas=replicas,
        gpus=gpus,
        gpu_hour_usd=3.0,
        headroom=headroom,
        n_plus_one=False,
        monthly_cost_usd=gpus * 3.0 * 730,
        replicas_band=(replicas, replicas),
        monthly_cost_band_usd=(gpus * 3.0 * 730, gpus * 3.0 * 730),
        average_utilisation=0.5,
        peak_utilisation=0.9,
        prefill_share=0.2,
        cached_context_share=0.0,
        decode_share=0.8,
        cost_per_1m_output_usd=1.0,
        cost_per_1m_input_usd=1.0,
        cost_per_1m_cached_input_usd=1.0,
        all_in_cost_per_1m_output_usd=1.0,
        all_in_cost_per_1m_output_band_usd=(1.0, 1.0),
        fleet_cost_per_1m_output_usd=1.0,
        formula="",
    )


def test_mean_rate_fleet_is_sized_as_the_peak_fleet() -> None:
    """The fleet at the mean rate rounds as the capacity stage's peak fleet does: 2.1 req/s at
    0.7 req/s a replica is 3 replicas (the ratio computes as 3.0000000000000004), not 4."""
    cost = _cost(replicas=20, gpus=40, headroom=1.0)
    assert _monthly_at(cost, 0.7, 2.1) == 3 * 2 * 3.0 * HOURS_PER_MONTH
    assert _monthly_at(cost, 0.7, 2.2) == 4 * 2 * 3.0 * HOURS_PER_MONTH
    assert _monthly_at(cost, 0.7, 0.0) is None


# ------------------------------------------------------------------ written once

COSTING = REPO / "pipeline" / "costing.py"
PRICE_SOURCES = ("manifest price_per_gpu_hour_usd", "config gpu_hour_usd.")
HOURS_TEXT = re.compile(r"(?<![\d.,])730(\.0)?\s*(h\b|hours?\b)|×\s*730(?![\d.,])")


def _sources() -> list[Path]:
    return sorted(p for p in (REPO / "pipeline").rglob("*") if p.is_file() and p != COSTING)


def hours_a_month_written(path: Path) -> list[str]:
    """Where ``path`` writes the hours in a month itself: the number 730 in code, or "730 h" /
    "× 730" in any text."""
    text = path.read_text(encoding="utf-8", errors="replace")
    found = [f"{path.name}: {m.group(0)!r}" for m in HOURS_TEXT.finditer(text)]
    if path.suffix == ".py":
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.NUMBER and token.string.replace("_", "") in ("730", "730.0"):
                found.append(f"{path.name}:{token.start[0]}: {token.string}")
    return found


def price_precedence_written(path: Path) -> list[str]:
    """Where ``path`` reads a price table's override or default itself (a precedence written
    again), or names a price's source as the costing module does."""
    if path.suffix != ".py":
        return []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("override", "default"):
            owner = node.value
            name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
            if name.endswith("prices"):
                found.append(f"{path.name}:{node.lineno}: {name}.{node.attr}")
        names_a_source = isinstance(node, ast.Constant) and any(
            source in str(node.value) for source in PRICE_SOURCES
        )
        if names_a_source:
            found.append(f"{path.name}:{node.lineno}: {node.value!r}")  # type: ignore[attr-defined]
    return found


def _text(folder: Path, name: str, text: str) -> Path:
    (folder / name).write_text(text)
    return folder / name


def test_the_detectors_find_what_they_look_for(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "HOURS = 730.0\n"
        'TEXT = "× 730 h"\n'
        "def f(prices):\n"
        "    return prices.override or settings.prices.default\n"
        'SOURCE = "manifest price_per_gpu_hour_usd"\n'
    )
    assert hours_a_month_written(sample) == ["sample.py: '× 730'", "sample.py:1: 730.0"]
    assert hours_a_month_written(_text(tmp_path, "prose.md", "a month is 730 hours")) == [
        "prose.md: '730 hours'"
    ]
    assert sorted(f.split(": ", 1)[1] for f in price_precedence_written(sample)) == [
        "'manifest price_per_gpu_hour_usd'",
        "prices.default",
        "prices.override",
    ]


def test_hours_and_price_precedence_are_written_only_in_costing() -> None:
    found = [f for path in _sources() for f in hours_a_month_written(path)]
    found += [f for path in _sources() for f in price_precedence_written(path)]
    assert found == [], "write these with pipeline/costing.py's constants and Prices.price_for"
