"""The capacity band carried through: how it is made (fit residuals with the validation error),
replicas, monthly cost, cost per 1M and payback at its ends (pipeline/costing.py), and the
decision's tie when two engines' cost bands overlap (docs/decision-rules.md#tie).

Hand figures: one $3/h GPU per replica ($2,190 a month), 200 output tokens a request, a
20 req/s peak, no headroom (the ranking tests' context, tests/test_decision_ranking_expert.py).
"""

from __future__ import annotations

import json
from dataclasses import replace

import polars as pl
import pytest

from pipeline.capacity.compute import (
    band_basis,
    capacity_band,
    carry_to_workload,
    workload_requests,
)
from pipeline.capacity.result import Slo
from pipeline.config import default_config
from pipeline.costing import (
    WEEKS_PER_MONTH,
    fractional_replicas_band,
    payback_band,
    per_capacity_band,
    replicas_band,
    saving_band,
)
from pipeline.decision.compute import decided
from pipeline.decision.costing import choose, payback
from pipeline.decision.evidence import EngineBench
from pipeline.decision.flips import moved
from pipeline.decision.present import candidates_table, payback_text, ranking_text
from pipeline.decision.result import DecisionRecord
from pipeline.present.text import months_band
from pipeline.report.sections.memo import decision_memo
from pipeline.unknown import Unknown
from pipeline.whatif.present import scenario_lines
from pipeline.whatif.result import ScenarioOutcome
from tests.test_decision_ranking_expert import REPLICA_MONTH, bench, hand_context


def banded(engine: str, capacity_rps: float, band: tuple[float, float]) -> EngineBench:
    """One engine's evidence with the workload's capacity known within ``band``."""
    return replace(bench(engine, capacity_rps), capacity_band_rps=band, cost_basis="workload")


# ---- the band: fit residuals and validation error --------------------------------------


def test_the_validation_error_is_the_configured_documented_figure() -> None:
    """One number, in defaults.yaml with its source: the worst error of a capacity the
    real-engine check's stage carries, +29.5 %."""
    assert default_config().capacity.validation_error == 0.30


def test_a_transferred_band_combines_residuals_and_validation_error_by_hand() -> None:
    """Capacity 2 req/s, residual band 1.8–2.2, validation error 29 %: the truth lies within
    2 ÷ 1.29 … 2 ÷ 0.71; in logs, below √(ln(2/1.8)² + ln 1.29²) = 0.27558, above
    √(ln 1.1² + ln(1/0.71)²) = 0.35550: 2·e^−0.27558 = 1.5183, 2·e^0.35550 = 2.8538."""
    low, high = capacity_band(2.0, (1.8, 2.2), 0.29)
    assert low == pytest.approx(1.51827, abs=1e-5)
    assert high == pytest.approx(2.85380, abs=1e-5)
    # Wider than either source alone.
    assert low < min(1.8, 2.0 / 1.29) and high > max(2.2, 2.0 / 0.71)
    said = band_basis(2.0, (1.8, 2.2), 0.1, 0.29)
    assert "residuals (steps ± 10%: 1.8–2.2 req/s)" in said
    assert "validation error of a transferred capacity (± 29%: 1.55–2.82 req/s)" in said


def test_a_measured_capacity_keeps_its_measurement_noise_alone() -> None:
    assert capacity_band(2.0, (1.8, 2.2), 0.0) == pytest.approx((1.8, 2.2))
    assert band_basis(2.0, (1.8, 2.2), 0.1, 0.0).endswith(
        "only: measured on this workload's own traffic"
    )


# ---- the band through the costing formulas ---------------------------------------------


def test_replicas_monthly_cost_and_per_token_bands_by_hand() -> None:
    """10 req/s peak, capacity band 1.6–2.5, headroom 0.8: the high end needs ⌈10 ÷ (2.5 ×
    0.8)⌉ = 5 replicas, the low end ⌈10 ÷ 1.28⌉ = ⌈7.8125⌉ = 8; N+1 adds one to each."""
    assert replicas_band(10.0, (1.6, 2.5), 0.8) == (5, 8)
    assert replicas_band(10.0, (1.6, 2.5), 0.8, spare=True) == (6, 9)
    assert fractional_replicas_band(10.0, (1.6, 2.5), 0.8) == pytest.approx((5.0, 7.8125))
    # $0.50 per 1M at 2 req/s: the same hour over 2.5 req/s is $0.40, over 1.6 $0.625.
    assert per_capacity_band(0.5, 2.0, (1.6, 2.5)) == pytest.approx((0.4, 0.625))


def test_payback_band_by_hand_with_a_never_end() -> None:
    """Bills today $10,000–$12,000, after the switch $7,000–$8,000: the saving is $2,000 at
    worst, $5,000 at best; a one-off of $20,000–$24,000 pays back in 20,000 ÷ 5,000 = 4 to
    24,000 ÷ 2,000 = 12 months. A worst end that saves nothing never pays back."""
    saving = saving_band((10_000.0, 12_000.0), (7_000.0, 8_000.0))
    assert saving == (2_000.0, 5_000.0)
    assert payback_band((20_000.0, 24_000.0), saving) == (4.0, 12.0)
    assert payback_band((20_000.0, 24_000.0), (-1_000.0, 5_000.0)) == (4.0, "never")
    assert payback_band((20_000.0, 24_000.0), (-3_000.0, 0.0)) == ("never", "never")
    assert months_band((4.0, 12.0)) == "4.0–12.0 months"
    assert months_band((4.0, "never")) == "4.0 months at best, never at worst"
    assert months_band(("never", "never")) == "never at either end of the band"


# ---- the decision: overlapping bands are a tie ------------------------------------------


def test_overlapping_cost_bands_are_a_tie_decided_on_the_non_cost_rules() -> None:
    """vLLM at 5 req/s (band 4–6.5) needs 20 ÷ 5 = 4 replicas' worth, SGLang at 6 (band
    5–7.5) 3.333: SGLang is 20 % cheaper, beyond the 10 % margin. But the bands of the
    compared fleets are vLLM 20 ÷ 6.5 × $2,190 = $6,738 … 20 ÷ 4 × $2,190 = $10,950 and
    SGLang 20 ÷ 7.5 × $2,190 = $5,840 … 20 ÷ 5 × $2,190 = $8,760: they overlap, a tie. vLLM
    runs today, which decides it."""
    benches = [banded("vllm", 5.0, (4.0, 6.5)), banded("sglang", 6.0, (5.0, 7.5))]
    outcome = choose(hand_context(benches, {"current_engine": "vllm"}))
    assert (outcome.engine, outcome.runner_up, outcome.confidence) == ("vllm", "sglang", "tie")
    ranking = outcome.ranking
    assert ranking is not None and ranking.bands_overlap is True
    assert ranking.gap == pytest.approx(0.2)
    assert ranking.value_bands["vllm"] == pytest.approx(
        (20 / 6.5 * REPLICA_MONTH, 20 / 4 * REPLICA_MONTH)
    )
    assert ranking.value_bands["sglang"] == pytest.approx(
        (20 / 7.5 * REPLICA_MONTH, 20 / 5 * REPLICA_MONTH)
    )
    tie = outcome.reasons[0]
    assert tie.startswith("SGLang and vLLM are 20.0% apart on ")
    assert "but their bands overlap (vLLM $6,738–$10,950 a month, SGLang $5,840–$8,760" in tie
    assert "vLLM is chosen because it runs today (no migration)" in tie
    assert "overlap, which is a tie" in ranking_text(ranking)
    # Without the bands the same figures are a firm win for SGLang on cost.
    plain = choose(
        hand_context([bench("vllm", 5.0), bench("sglang", 6.0)], {"current_engine": "vllm"})
    )
    assert plain.confidence == "firm" and plain.ranking is not None
    assert plain.ranking.bands_overlap is None and plain.ranking.value_bands == {}


def test_bands_apart_leave_the_cost_to_decide() -> None:
    """vLLM at 5 (band 4.5–5.5): $7,964 … $9,733; SGLang at 7 (band 6.5–7.5): $5,840 …
    $6,738. Apart: SGLang wins on cost, firm, and the rule says the bands do not overlap."""
    ctx = hand_context([banded("vllm", 5.0, (4.5, 5.5)), banded("sglang", 7.0, (6.5, 7.5))])
    outcome = choose(ctx)
    assert (outcome.engine, outcome.confidence) == ("sglang", "firm")
    assert outcome.ranking is not None and outcome.ranking.bands_overlap is False
    margin = next(r for r in ctx.rules if r.rule == "margin")
    assert margin.fired is False
    assert margin.effect.startswith(
        "the gap, 40.0%, exceeds the tie band and their bands do not overlap "
        "(SGLang $5,840–$6,738 a month, vLLM $7,964–$9,733 a month)"
    )
    assert margin.evidence["bands_overlap"] is False


def test_one_engine_without_a_band_leaves_the_margin_to_decide() -> None:
    """An engine priced on its benchmark's own figures has no capacity band: nothing to
    overlap, the margin alone decides (SGLang 20 % cheaper: firm)."""
    ctx = hand_context([bench("vllm", 5.0), banded("sglang", 6.0, (5.0, 7.5))])
    outcome = choose(ctx)
    assert (outcome.engine, outcome.confidence) == ("sglang", "firm")
    assert outcome.ranking is not None and outcome.ranking.bands_overlap is None
    assert set(outcome.ranking.value_bands) == {"sglang"}
    assert ctx.benches["vllm"].monthly_gpu_band_usd is None


def test_a_switch_payback_band_says_never_at_its_worst_end() -> None:
    """vLLM runs today at 5 req/s (band 4–6.5): ⌈20 ÷ 6.5⌉ = 4 … ⌈20 ÷ 4⌉ = 5 replicas, $8,760
    … $10,950 a month. SGLang at 6 (band 5–7.5): ⌈20 ÷ 7.5⌉ = 3 … ⌈20 ÷ 5⌉ = 4 replicas, $6,570
    … $8,760. Both need 4 replicas at the capacity: switching saves nothing, never. Over the
    bands it saves $0 at worst (never) and $10,950 − $6,570 = $4,380 at best: (4 weeks ×
    $5,000 + $6,570 × (4 + revalidation) weeks ÷ weeks a month) ÷ $4,380 months."""
    ctx = hand_context(
        [banded("vllm", 5.0, (4.0, 6.5)), banded("sglang", 6.0, (5.0, 7.5))],
        {
            "current_engine": "vllm",
            "engineer_week_usd": 5_000,
            "migration_engineer_weeks": {"sglang": 4},
        },
    )
    assert ctx.benches["vllm"].replicas_band_at_peak == (4, 5)
    assert ctx.benches["sglang"].monthly_gpu_band_usd == (3 * REPLICA_MONTH, 4 * REPLICA_MONTH)
    found = payback(ctx, "sglang")
    assert found is not None and found.status == "never"
    assert found.monthly_saving_band_usd == pytest.approx((0.0, 4_380.0))
    weeks = 4 + ctx.settings.revalidation_weeks
    soonest = (4 * 5_000 + 6_570 * weeks / WEEKS_PER_MONTH) / 4_380
    assert found.months_band is not None
    assert found.months_band[0] == pytest.approx(soonest)
    assert found.months_band[1] == "never"
    assert payback_text(found).endswith(
        f"(over the capacity band: {soonest:,.1f} months at best, never at worst)"
    )


def test_an_unknown_capacity_is_unknown_through_its_band_and_cost() -> None:
    """No serving model: the capacity, its band and its cost are the same Unknown, with the
    reason; the decision then has no band for the engine (its benchmark's figures stand)."""
    no_model = Unknown(reason="every point failed the SLO")
    work = workload_requests(pl.DataFrame({"prompt_tokens": [100, 200], "output_tokens": [50, 60]}))
    found = carry_to_workload(
        "vllm",
        no_model,
        work,
        Slo(ttft_p95_ms=1_000, itl_p99_ms=60),
        kv_tokens=100_000,
        gpu_hour_usd=3.0,
        peak_rate_rps=20.0,
        mean_rate_rps=10.0,
        config=default_config().capacity,
    )
    assert found.workload_capacity_band_rps == no_model and found.cost == no_model
    assert found.band_basis is None
    ctx = hand_context(
        [bench("vllm", 5.0), bench("sglang", 7.0)],
        {"current_engine": "vllm", "engineer_week_usd": 5_000},
    )
    switch = payback(ctx, "sglang")
    assert switch is not None and switch.status == "months"
    assert switch.months_band is None and switch.monthly_saving_band_usd is None
    assert "capacity band" not in payback_text(switch)
    assert ctx.benches["sglang"].cost_per_1m_output_band_usd is None
    outcome = choose(ctx)
    assert outcome.ranking is not None and "bands" not in ranking_text(outcome.ranking)


def test_the_what_if_says_the_monthly_cost_with_its_band() -> None:
    outcome = ScenarioOutcome(
        name="double",
        changes={"traffic_scale": 2.0},
        engine="vllm",
        engine_name="vLLM",
        runner_up=None,
        runner_up_name=None,
        routing_layer=None,
        confidence="firm",
        monthly_cost_usd=8_760.0,
        monthly_cost_band_usd=(6_570.0, 10_950.0),
        monthly_total_usd=None,
        headline="",
        against_today=[],
        approximations=[],
    )
    assert scenario_lines(outcome)[1] == ("  vLLM (firm), $8,760/month GPU (band $6,570–$10,950)")
    unbanded = outcome.model_copy(update={"monthly_cost_band_usd": None})
    assert scenario_lines(unbanded)[1] == "  vLLM (firm), $8,760/month GPU"


def test_the_record_and_page_one_carry_the_band() -> None:
    """vLLM alone at 5 req/s (band 4–6.5) for a 20 req/s peak: 4 replicas, $8,760 a month;
    over the band ⌈20 ÷ 6.5⌉ = 4 … ⌈20 ÷ 4⌉ = 5 replicas, $8,760–$10,950, and $3 ÷ (6.5 × 200
    × 3600) × 10⁶ = $0.6410 … $3 ÷ (4 × 200 × 3600) × 10⁶ = $1.0417 per 1M output tokens.
    Page 1 prices it "$8,760 (band $8,760–$10,950)"."""
    record = decided(moved(hand_context([banded("vllm", 5.0, (4.0, 6.5))])))
    (c,) = [c for c in record.candidates if c.engine == "vllm"]
    assert c.replicas == 4 and c.replicas_band == (4, 5)
    assert c.monthly_cost_band_usd == pytest.approx((4 * REPLICA_MONTH, 5 * REPLICA_MONTH))
    assert c.cost_per_1m_output_band_usd == pytest.approx(
        (3 / (6.5 * 200 * 3600) * 1e6, 3 / (4 * 200 * 3600) * 1e6), rel=1e-5
    )
    again = DecisionRecord.from_json(json.loads(json.dumps(record.to_json())), "here")
    assert again == record
    options = {o.engine: o for o in decision_memo(record, None).options}
    assert (options["vLLM"].monthly, options["vLLM"].monthly_band) == (
        "$8,760",
        "band $8,760–$10,950",
    )
    unbanded = decided(moved(hand_context([bench("vllm", 5.0)])))
    options = {o.engine: o for o in decision_memo(unbanded, None).options}
    assert (options["vLLM"].monthly, options["vLLM"].monthly_band) == ("$8,760", None)


def _first_row(table: str) -> dict[str, str]:
    header, _, row = table.splitlines()[:3]
    return dict(zip(header[2:-2].split(" | "), row[2:-2].split(" | "), strict=True))


def test_the_decide_table_shows_both_bands_beside_the_figures() -> None:
    """The same hand case in ``enginefit decide``'s table: $/1M out 0.641–1.04 (three
    significant digits, as every cell) and $8,760–$10,950 a month; an engine without a band
    says unknown there, not a band of zero width."""
    record = decided(moved(hand_context([banded("vllm", 5.0, (4.0, 6.5))])))
    cells = _first_row(candidates_table(record))
    assert cells["$/1M out band"] == "0.641–1.04"
    assert cells["$/month band"] == "8,760–10,950"
    unbanded = decided(moved(hand_context([bench("vllm", 5.0)])))
    cells = _first_row(candidates_table(unbanded))
    assert (cells["$/1M out band"], cells["$/month band"]) == ("unknown", "unknown")
