"""Request lifetimes (pinning by running requests), load-dependent durations, cache-aware presets,
the new simulation config keys and what the scenario summary says about them. Expected values
are worked out by hand in the comments (block size 4)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl
import pytest
from pydantic import ValidationError

from pipeline.config import config_from_mapping
from pipeline.errors import ConfigError
from pipeline.schema import conform
from pipeline.sim import replay as replay_module
from pipeline.sim.blocks import SimulationInputError, sim_input
from pipeline.sim.config import CacheAwareConfig, Scenario
from pipeline.sim.replay import assign, simulate, summarise
from tests.conftest import DEFAULTS, sim_settings

T0 = datetime(2026, 1, 1, tzinfo=UTC)
B = 4


def canonical(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """Rows: t_ms, hashes, prompt_tokens (default 4·len + 1), e2e_ms."""
    return conform(
        pl.DataFrame(
            {
                "request_id": [f"r{i}" for i in range(len(rows))],
                "arrival": [T0 + timedelta(milliseconds=r["t_ms"]) for r in rows],
                "prompt_tokens": [r.get("prompt_tokens", 4 * len(r["hashes"]) + 1) for r in rows],
                "output_tokens": [0] * len(rows),
                "e2e_ms": [r.get("e2e_ms") for r in rows],
                "block_size": [B] * len(rows),
                "prefix_hashes": [r["hashes"] for r in rows],
                "prompt_blocks": [len(r["hashes"]) for r in rows],
                "hashes_known": [True] * len(rows),
            },
            schema_overrides={"prefix_hashes": pl.List(pl.UInt64)},
        )
    )


# --------------------------------------------------------------------------------------------
# Pinning (durations lifetime)
# --------------------------------------------------------------------------------------------

# A 2-block cache (8 tokens). r0 holds [1, 2] for 10 s; r1 and r2 send [3, 4] for 1 s each.
PINNING = [
    {"t_ms": 0, "hashes": [1, 2], "e2e_ms": 10_000.0},
    {"t_ms": 1000, "hashes": [3, 4], "e2e_ms": 1000.0},
    {"t_ms": 3000, "hashes": [3, 4], "e2e_ms": 1000.0},
    {"t_ms": 4000, "hashes": [1, 2], "e2e_ms": 1000.0},
]


def test_pinned_blocks_are_never_evicted_and_count_as_cached() -> None:
    inp = sim_input(canonical(PINNING), latency_model=DEFAULTS.shape.latency)
    sc = Scenario(B, 1, 8, "round-robin")
    run = simulate(inp, sc, sim_settings(request_lifetime="durations"))
    # durations: r1 pins 3, 4 beside r0's pinned 1, 2 (4 blocks in a 2-block cache: nothing
    # is free to evict). At 3 s r1 is released (4 then 3 join the free queue) and evicted
    # again at once, since r0 still pins 1, 2: r2 misses. r2 pins 3, 4 until 4 s; at 4 s it is
    # released and evicted; r3 meets r0's pinned 1, 2: 2 blocks (limit ⌊8/4⌋ = 2) = 8 tokens.
    assert run.hit_tokens.tolist() == [0, 0, 0, 8]
    assert run.peak_pinned_blocks.tolist() == [4]
    # instant: r0's 1, 2 are evicted by r1's 3, 4; r2 hits them; r3 misses.
    assert run.hit_tokens_instant is not None
    assert run.hit_tokens_instant.tolist() == [0, 0, 8, 0]
    instant = simulate(inp, sc, sim_settings(request_lifetime="instant"))
    assert instant.hit_tokens.tolist() == [0, 0, 8, 0]
    assert instant.peak_pinned_blocks.tolist() == [0]


def test_release_frees_the_tail_first_so_the_head_survives() -> None:
    # r0 = [1, 2, 3] pins 3 blocks in a 2-block cache for 1 s. Released at 5 s tail first:
    # 3, 2, 1 join the free queue in that order and 3 (the tail) is evicted; r1 hits 1, 2.
    rows = [
        {"t_ms": 0, "hashes": [1, 2, 3], "e2e_ms": 1000.0},
        {"t_ms": 5000, "hashes": [1, 2, 3], "e2e_ms": 1000.0},
    ]
    run = simulate(
        sim_input(canonical(rows), latency_model=DEFAULTS.shape.latency),
        Scenario(B, 1, 8, "round-robin"),
        DEFAULTS.simulation,
    )
    assert run.hit_tokens.tolist() == [0, 8]


def test_shared_blocks_stay_pinned_while_any_holder_runs() -> None:
    # r0 = [1, 2] runs 10 s; r1 = [1, 2, 5] runs 1 s. At r1's release only 5 reaches ref 0
    # (1 and 2 are still held by r0), so eviction down to 2 blocks takes 5. r2 = [1, 2, 5]
    # (13 tokens, limit 3) hits the pinned 1, 2 only: 8 tokens.
    rows = [
        {"t_ms": 0, "hashes": [1, 2], "e2e_ms": 10_000.0},
        {"t_ms": 100, "hashes": [1, 2, 5], "e2e_ms": 1000.0},
        {"t_ms": 2000, "hashes": [1, 2, 5], "e2e_ms": 1000.0},
    ]
    run = simulate(
        sim_input(canonical(rows), latency_model=DEFAULTS.shape.latency),
        Scenario(B, 1, 8, "round-robin"),
        DEFAULTS.simulation,
    )
    assert run.hit_tokens.tolist() == [0, 8, 8]
    assert run.peak_pinned_blocks.tolist() == [3]


def test_summary_reports_the_lifetime_pinning_and_a_warning() -> None:
    inp = sim_input(canonical(PINNING), latency_model=DEFAULTS.shape.latency)
    sc = Scenario(B, 1, 8, "round-robin")
    out = summarise(inp, simulate(inp, sc, DEFAULTS.simulation))
    assert out["request_lifetime"] == {
        "mode": "durations",
        "durations_logged": 4,
        "durations_estimated": 0,
        "latency_model": None,
        "replica_slots": 64,
    }
    assert (out["hit_tokens"], out["hit_tokens_instant"]) == (8, 8)
    assert out["hit_ratio_instant"] == pytest.approx(8 / 36)
    # peak 4 pinned blocks = 16 tokens = 200 % of the 8-token cache
    assert out["per_replica"][0]["peak_pinned_blocks"] == 4
    assert out["per_replica"][0]["peak_pinned_tokens"] == 16
    assert out["peak_pinned_tokens"] == 16
    assert out["warnings"] == [
        "tokens pinned by running requests at peak reach 200 % of the cache capacity"
    ]
    # 16 tokens pinned against a 32-token cache is 50 %: below PINNED_WARN_SHARE (0.8)
    roomy = Scenario(B, 1, 32, "round-robin")
    run = simulate(inp, roomy, DEFAULTS.simulation)
    assert summarise(inp, run)["warnings"] == []
    # against a 20-token cache it is 80 %: the share is reached, so it warns
    tight = Scenario(B, 1, 20, "round-robin")
    warned = summarise(inp, simulate(inp, tight, DEFAULTS.simulation))
    assert warned["warnings"] == [
        "tokens pinned by running requests at peak reach 80 % of the cache capacity"
    ]
    instant = summarise(inp, simulate(inp, sc, sim_settings(request_lifetime="instant")))
    assert instant["request_lifetime"] == {
        "mode": "instant",
        "note": "no durations: blocks released at arrival, nothing pinned",
    }
    assert instant["hit_tokens"] == instant["hit_tokens_instant"] == 8
    assert instant["warnings"] == [] and instant["peak_pinned_tokens"] == 0


def test_estimated_durations_are_counted_and_labelled() -> None:
    rows = [{"t_ms": i, "hashes": [1]} for i in range(3)]
    rows[0]["e2e_ms"] = 5.0
    inp = sim_input(canonical(rows), latency_model=DEFAULTS.shape.latency)
    run = simulate(inp, Scenario(B, 1, 100, "round-robin"), DEFAULTS.simulation)
    out = summarise(inp, run)
    lifetime = out["request_lifetime"]
    assert (lifetime["durations_logged"], lifetime["durations_estimated"]) == (1, 2)
    assert lifetime["latency_model"]["source"] == "config"
    assert out["durations"]["estimated"] is True


def test_unknown_lifetime_and_bad_slots_are_refused() -> None:
    with pytest.raises(ValidationError, match="request_lifetime"):
        sim_settings(request_lifetime="forever")
    with pytest.raises(ValidationError, match="replica_slots"):
        sim_settings(replica_slots=0)


# --------------------------------------------------------------------------------------------
# Load-dependent durations
# --------------------------------------------------------------------------------------------


def test_least_loaded_sees_durations_stretched_past_the_slots() -> None:
    rows = [
        {"t_ms": 0, "hashes": [1], "e2e_ms": 100.0},
        {"t_ms": 10, "hashes": [2], "e2e_ms": 100.0},
        {"t_ms": 20, "hashes": [3], "e2e_ms": 100.0},
        {"t_ms": 150, "hashes": [4], "e2e_ms": 10.0},
        {"t_ms": 210, "hashes": [5], "e2e_ms": 10.0},
    ]
    inp = sim_input(canonical(rows), latency_model=DEFAULTS.shape.latency)
    # one slot: r0 → 0 (ends 100), r1 → 1 (ends 110), r2 → 0 with 2 in flight there: 100 ms ×
    # 2 / 1, ends 220. r3 at 150: loads (1, 0) → 1 (ends 160). r4 at 210: r2 still runs → 1.
    assert assign(inp, "least-loaded", 2, sim_settings(replica_slots=1)).replica.tolist() == [
        0,
        1,
        0,
        1,
        1,
    ]
    # no slot limit: r2 ends at 120, so r3 and r4 meet two idle replicas → 0.
    assert assign(inp, "least-loaded", 2, sim_settings(replica_slots=None)).replica.tolist() == [
        0,
        1,
        0,
        0,
        0,
    ]


# Twenty requests for one prompt, 100 ms apart, 250 ms each. With fixed durations at most two
# are in flight at an arrival (t - 100, t - 200), so the 2-request imbalance margin never trips
# and cache affinity keeps every request on replica 0. With one slot per replica a request
# admitted with n in flight takes 250 × n ms: r0 ends at 250, r1 (2 in flight) at 600, r2 (3)
# at 950, r3 (3) at 1050; at 400 ms r4 finds 3 in flight on replica 0 and none on replica 1:
# 3 - 0 > 2 and 3 > 0 × 1.5, so the imbalance rule sends it away.
AFFINE = [{"t_ms": 100 * i, "hashes": [1, 2, 3], "e2e_ms": 250.0} for i in range(20)]
KNOBS = CacheAwareConfig.from_preset("library", balance_abs_threshold=2, balance_rel_threshold=1.5)


def test_growing_durations_let_the_imbalance_rule_fire() -> None:
    inp = sim_input(canonical(AFFINE), latency_model=DEFAULTS.shape.latency)
    sc = Scenario(B, 2, 10_000, "cache-aware")
    fixed = simulate(inp, sc, sim_settings(cache_aware=KNOBS, replica_slots=None))
    assert fixed.balance_routed == 0
    assert fixed.replica.tolist() == [0] * 20
    loaded = simulate(inp, sc, sim_settings(cache_aware=KNOBS, replica_slots=1))
    assert loaded.replica.tolist()[:5] == [0, 0, 0, 0, 1]
    assert loaded.balance_routed > 0
    assert summarise(inp, loaded)["balance_routed"] == loaded.balance_routed


# --------------------------------------------------------------------------------------------
# Cache-aware presets and the router's view
# --------------------------------------------------------------------------------------------


def test_presets_and_overrides() -> None:
    assert DEFAULTS.simulation.cache_aware == CacheAwareConfig.from_preset("library")
    library = CacheAwareConfig.from_preset("library")
    assert (
        library.cache_threshold,
        library.balance_abs_threshold,
        library.balance_rel_threshold,
    ) == (0.5, 32, 1.1)
    launcher = CacheAwareConfig.from_preset("launcher")
    assert (
        launcher.cache_threshold,
        launcher.balance_abs_threshold,
        launcher.balance_rel_threshold,
    ) == (0.3, 64, 1.5)
    tuned = CacheAwareConfig.from_preset("launcher", cache_threshold=0.4)
    assert tuned.as_dict() == {
        "preset": "launcher",
        "overridden": ["cache_threshold"],
        "cache_threshold": 0.4,
        "balance_abs_threshold": 64,
        "balance_rel_threshold": 1.5,
    }
    with pytest.raises(ValueError, match="preset"):
        CacheAwareConfig.from_preset("cli")


def test_summary_states_the_preset_and_the_router_view() -> None:
    inp = sim_input(canonical(AFFINE[:4]), latency_model=DEFAULTS.shape.latency)
    run = simulate(
        inp,
        Scenario(B, 2, 10_000, "cache-aware"),
        sim_settings(cache_aware=CacheAwareConfig.from_preset("launcher")),
    )
    ca = summarise(inp, run)["cache_aware"]
    assert ca["preset"] == "launcher"
    assert (ca["cache_threshold"], ca["balance_abs_threshold"]) == (0.3, 64)
    assert "exact caches" in ca["router_view"] and "approximate" in ca["router_view"]
    plain = simulate(inp, Scenario(B, 2, 10_000, "round-robin"), DEFAULTS.simulation)
    assert summarise(inp, plain)["cache_aware"] is None


def test_router_state_above_the_memory_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    inp = sim_input(canonical(AFFINE), latency_model=DEFAULTS.shape.latency)
    sc = Scenario(B, 2, 10_000, "cache-aware")
    view = inp.blocks(B)
    # 3 distinct blocks; queue min(4 × (min(2500, 3) + 4), 60) + 64 = 92 entries (the chain of
    # 3 plus one run entry per request); 2 replicas × (3 + 92) × 4 bytes = 760 bytes.
    assert replay_module.routed_state_bytes(view, 2, 2500) == 760
    monkeypatch.setattr(replay_module, "MAX_ROUTED_STATE_BYTES", 759)
    with pytest.raises(SimulationInputError, match=r"2 replicas × \(3 blocks \+ 92 queue"):
        simulate(inp, sc, DEFAULTS.simulation)
    # fixed routings replay one replica at a time and are not limited
    assert (
        simulate(inp, Scenario(B, 2, 10_000, "round-robin"), DEFAULTS.simulation).hit_tokens.sum()
        > 0
    )


# --------------------------------------------------------------------------------------------
# Config keys
# --------------------------------------------------------------------------------------------


def test_new_config_keys_defaults_and_validation() -> None:
    default = DEFAULTS.simulation
    assert default.request_lifetime == "durations"
    assert default.replica_slots == 64
    assert default.cache_aware == CacheAwareConfig.from_preset("library")
    cfg = config_from_mapping(
        {
            "simulation": {
                "request_lifetime": "instant",
                "replica_slots": None,
                "cache_aware": {"preset": "launcher", "balance_abs_threshold": 8},
            }
        }
    ).simulation
    assert (cfg.request_lifetime, cfg.replica_slots) == ("instant", None)
    assert cfg.cache_aware == CacheAwareConfig.from_preset("launcher", balance_abs_threshold=8)
    for raw, message in (
        ({"request_lifetime": "forever"}, "simulation.request_lifetime"),
        ({"replica_slots": 0}, "simulation.replica_slots"),
        # a warn share that became a constant (pipeline.sim.replay) is no longer a key
        ({"pinned_warn_share": 0.5}, "unknown key simulation.pinned_warn_share"),
        ({"cache_aware": {"preset": "cli"}}, "simulation.cache_aware.preset"),
        (
            {"cache_aware": {"preset": "library", "eviction_interval_secs": 30}},
            "unknown key eviction_interval_secs",
        ),
    ):
        with pytest.raises(ConfigError) as caught:
            config_from_mapping({"simulation": raw})
        assert message in str(caught.value)


def test_curve_check_compares_the_instant_figures() -> None:
    from pipeline.sim.checks import curve_disagreements, curve_matches_replay
    from pipeline.sim.curve import capacity_curve
    from pipeline.sim.result import ScenarioSummary, curves_frame, scenario_frame

    # PINNING's first three requests: in a 2-block cache r2 misses while r0 pins 1, 2
    # (durations: 0 hit tokens) but hits 3, 4 when nothing is pinned (instant: 8)
    inp = sim_input(canonical(PINNING[:3]), latency_model=DEFAULTS.shape.latency)
    settings = DEFAULTS.simulation
    summaries = [
        ScenarioSummary.from_json(
            summarise(inp, simulate(inp, Scenario(B, 1, cache, "round-robin"), settings))
        )
        for cache in (8, 1000)
    ]
    scenarios = scenario_frame(summaries)
    assert scenarios["request_lifetime"].to_list() == ["durations"] * 2
    # rows sorted by scenario key: c1000 before c8
    assert scenarios["hit_tokens"].to_list() == [8, 0]
    assert scenarios["hit_tokens_instant"].to_list() == [8, 8]
    curves = curves_frame(
        [capacity_curve(inp, DEFAULTS.simulation, block_size=B, replicas=1, routing="round-robin")]
    )
    assert curve_disagreements(curves, scenarios).height == 0
    tampered = scenarios.with_columns(pl.col("hit_tokens_instant") + 1)
    bad = curve_disagreements(curves, tampered)
    assert bad["scenario"].to_list() == scenarios["scenario"].to_list()
    assert bad.columns[-2:] == ["hit_tokens_instant", "curve_hit_tokens"]
    assert curve_matches_replay(curves, scenarios) == []
    assert curve_matches_replay(curves, tampered)[1] == (
        f"{scenarios['scenario'][1]}: replay 9 hit tokens, curve 8 at 2 blocks"
    )
    # a sampled curve agrees within its stated error, a share of the scenario's prompt tokens
    prompt = scenarios["prompt_tokens"].to_list()
    off_by = [int(0.1 * p) + 1 for p in prompt]
    shifted = scenarios.with_columns(pl.col("hit_tokens_instant") + pl.Series(off_by))
    sampled = curves.with_columns(sample_rate=pl.lit(0.5), hit_ratio_error=pl.lit(0.1))
    assert curve_disagreements(sampled, tampered).height == 0
    assert (
        curve_disagreements(sampled, shifted)["scenario"].to_list()
        == scenarios["scenario"].to_list()
    )
    wider = sampled.with_columns(hit_ratio_error=pl.lit(0.1 + 2 / min(prompt)))
    assert curve_disagreements(wider, shifted).height == 0
