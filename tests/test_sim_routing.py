"""Routing policies across replicas: hand-computed assignments and the summary statistics."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import polars as pl
import pytest

from pipeline.schema import conform
from pipeline.sim.blocks import SimulationInputError, sim_input
from pipeline.sim.config import CacheAwareConfig, Scenario
from pipeline.sim.curve import capacity_curve
from pipeline.sim.replay import affinity_home, assign, simulate, summarise
from tests.conftest import DEFAULTS, sim_settings

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def canonical(rows: list[dict[str, Any]], block_size: int = 4) -> pl.DataFrame:
    return conform(
        pl.DataFrame(
            {
                "request_id": [f"r{i}" for i in range(len(rows))],
                "arrival": [T0 + timedelta(milliseconds=r.get("t_ms", 0)) for r in rows],
                "session_id": [r.get("session") for r in rows],
                "prompt_tokens": [r.get("prompt_tokens", 5) for r in rows],
                "output_tokens": [r.get("output_tokens", 0) for r in rows],
                "e2e_ms": [r.get("e2e_ms") for r in rows],
                "block_size": [block_size] * len(rows),
                "prefix_hashes": [r.get("hashes", [i + 1]) for i, r in enumerate(rows)],
                "prompt_blocks": [len(r.get("hashes", [0])) for r in rows],
                "hashes_known": [True] * len(rows),
            },
            schema_overrides={"prefix_hashes": pl.List(pl.UInt64)},
        )
    )


def test_round_robin_is_i_mod_r() -> None:
    inp = sim_input(
        canonical([{"t_ms": i} for i in range(7)]), latency_model=DEFAULTS.shape.latency
    )
    assert assign(inp, "round-robin", 3, DEFAULTS.simulation).replica.tolist() == [
        0,
        1,
        2,
        0,
        1,
        2,
        0,
    ]


def test_random_is_seeded() -> None:
    inp = sim_input(
        canonical([{"t_ms": i} for i in range(50)]), latency_model=DEFAULTS.shape.latency
    )
    a = assign(inp, "random", 4, sim_settings(random_seed=9)).replica
    assert a.tolist() == assign(inp, "random", 4, sim_settings(random_seed=9)).replica.tolist()
    assert a.tolist() != assign(inp, "random", 4, sim_settings(random_seed=10)).replica.tolist()
    assert set(a.tolist()) <= {0, 1, 2, 3}


def test_least_loaded_counts_requests_in_flight_at_arrival() -> None:
    # durations from logged e2e_ms; ties go to the lowest replica.
    rows = [
        {"t_ms": 0, "e2e_ms": 1000.0},  # → 0 (both idle)
        {"t_ms": 10, "e2e_ms": 50.0},  # → 1 (0 busy)
        {"t_ms": 100, "e2e_ms": 1000.0},  # r1 finished at 60 → loads (1, 0) → 1
        {"t_ms": 200, "e2e_ms": 10.0},  # loads (1, 1) → 0
        {"t_ms": 1000, "e2e_ms": 10.0},  # r0 ended at 1000 (not in flight), r3 ended: (0, 1) → 0
    ]
    inp = sim_input(canonical(rows), latency_model=DEFAULTS.shape.latency)
    assert inp.durations_estimated == 0
    assert assign(inp, "least-loaded", 2, DEFAULTS.simulation).replica.tolist() == [0, 1, 1, 0, 0]


def test_least_loaded_labels_estimated_durations() -> None:
    inp = sim_input(
        canonical([{"t_ms": i} for i in range(4)]), latency_model=DEFAULTS.shape.latency
    )
    out = summarise(
        inp,
        simulate(inp, Scenario(4, 2, 100, "least-loaded"), DEFAULTS.simulation),
    )
    assert out["durations"]["estimated"] is True
    assert out["durations"]["estimated_requests"] == 4
    assert out["durations"]["latency_model"]["source"] == "config"


def test_least_served_balances_tokens() -> None:
    rows = [{"prompt_tokens": p} for p in (100, 10, 10, 10, 200)]
    inp = sim_input(canonical(rows), latency_model=DEFAULTS.shape.latency)
    # served (0,0)→0; (100,0)→1; (100,10)→1; (100,20)→1; (100,30)→1
    assert assign(inp, "least-served", 2, DEFAULTS.simulation).replica.tolist() == [0, 1, 1, 1, 1]


def test_affinity_is_a_stable_function_of_the_session() -> None:
    rows = [{"session": s} for s in ("a", "b", "a", "c", "b", "a")]
    inp = sim_input(canonical(rows), latency_model=DEFAULTS.shape.latency)
    homes = affinity_home(inp, 8).tolist()
    assert homes[0] == homes[2] == homes[5] and homes[1] == homes[4]
    # Same session, same home, whatever else is in the table.
    other = sim_input(
        canonical([{"session": "zz"}, {"session": "a"}]), latency_model=DEFAULTS.shape.latency
    )
    assert affinity_home(other, 8).tolist()[1] == homes[0]


def test_bounded_affinity_spills_when_home_exceeds_the_bound() -> None:
    # One session for everything: home h. With R=2, margin 0.5 the bound after i+1 requests is
    # ceil(1.5 (i+1) / 2) = 1, 2, 3, 3, 4, 5 ...
    rows = [{"session": "only"} for _ in range(6)]
    inp = sim_input(canonical(rows), latency_model=DEFAULTS.shape.latency)
    h = int(affinity_home(inp, 2)[0])
    out = assign(inp, "bounded-affinity", 2, sim_settings(bounded_affinity_margin=0.5))
    o = 1 - h
    # i=0: 0+1<=1 home; i=1: 1+1<=2 home; i=2: 2+1<=3 home; i=3: 3+1>3 spill (other has 0);
    # i=4: 3+1<=4 home; i=5: 4+1<=5 home
    assert out.replica.tolist() == [h, h, h, o, h, h]
    assert out.spills == 1
    # margin so large nothing spills: plain affinity
    assert (
        assign(
            inp, "bounded-affinity", 2, sim_settings(bounded_affinity_margin=10.0)
        ).replica.tolist()
        == [h] * 6
    )


def _cache_aware(rows: list[dict[str, Any]], **cfg: Any) -> tuple[list[int], int]:
    inp = sim_input(canonical(rows), latency_model=DEFAULTS.shape.latency)
    run = simulate(
        inp,
        Scenario(4, 2, 10_000, "cache-aware"),
        sim_settings(cache_aware=CacheAwareConfig.from_preset("library", **cfg)),
    )
    return run.replica.tolist(), run.balance_routed


def test_cache_aware_follows_the_prefix_above_the_threshold() -> None:
    conv = [1, 2, 3]
    rows = [
        {"t_ms": 0, "hashes": conv, "prompt_tokens": 13, "e2e_ms": 1e6},  # min load → 0
        {"t_ms": 1, "hashes": [9], "prompt_tokens": 5, "e2e_ms": 1e6},  # no match → min load 1
        # matches 12 of 13 tokens on replica 0 (rate .92 > .5): goes to 0 despite its load
        {"t_ms": 2, "hashes": conv, "prompt_tokens": 13, "e2e_ms": 1e6},
        # matches 4 of 13 on replica 0 (rate .31 ≤ .5): min load, replica 1
        {"t_ms": 3, "hashes": [1, 7, 8], "prompt_tokens": 13, "e2e_ms": 1e6},
    ]
    assert _cache_aware(rows, balance_abs_threshold=32) == ([0, 1, 0, 1], 0)
    # a lower threshold lets the short match win too
    assert _cache_aware(rows, cache_threshold=0.3, balance_abs_threshold=32) == ([0, 1, 0, 0], 0)


def test_cache_aware_imbalance_rule_overrides_the_cache() -> None:
    conv = [1, 2, 3]
    rows = [{"t_ms": i, "hashes": conv, "prompt_tokens": 13, "e2e_ms": 1e6} for i in range(5)]
    # abs 1, rel 1.5, everything stays in flight. r0: no match → min load 0. r1: loads (1, 0)
    # balanced enough (1 - 0 ≤ 1), 12/13 match on 0 → 0. r2: loads (2, 0), 2 - 0 > 1 and
    # 2 > 0 × 1.5 → imbalance rule → 1. r3: (2, 1) balanced; both replicas hold the chain, the
    # tie goes to the lower load → 1. r4: (2, 2), tie on match and load → lowest index 0.
    replicas, balanced = _cache_aware(rows, balance_abs_threshold=1, balance_rel_threshold=1.5)
    assert replicas == [0, 0, 1, 1, 0]
    assert balanced == 1


def test_cache_aware_has_no_single_pass_curve() -> None:
    inp = sim_input(canonical([{}, {}]), latency_model=DEFAULTS.shape.latency)
    with pytest.raises(SimulationInputError, match="cache state"):
        capacity_curve(inp, DEFAULTS.simulation, block_size=4, replicas=2, routing="cache-aware")
    with pytest.raises(SimulationInputError, match="unknown routing"):
        assign(inp, "sticky", 2, DEFAULTS.simulation)


def test_summary_statistics_add_up() -> None:
    rows = [
        {
            "t_ms": i,
            "hashes": [1, 2],
            "prompt_tokens": 9,
            "output_tokens": 3,
            "session": f"s{i % 3}",
        }
        for i in range(12)
    ]
    inp = sim_input(canonical(rows), latency_model=DEFAULTS.shape.latency)
    out = summarise(
        inp,
        simulate(inp, Scenario(4, 4, 1000, "round-robin"), DEFAULTS.simulation),
    )
    assert out["prompt_tokens"] == 12 * 9
    # each replica gets 3 requests: first misses, next two hit 8 tokens each
    assert out["hit_tokens"] == 4 * 2 * 8
    assert out["prefill_tokens"] == out["prompt_tokens"] - out["hit_tokens"]
    assert out["hit_ratio"] == pytest.approx(64 / 108)
    assert [r["requests"] for r in out["per_replica"]] == [3, 3, 3, 3]
    assert out["request_imbalance"] == 1.0
    assert sum(r["tokens"] for r in out["per_replica"]) == 12 * 12
    # affinity over 3 sessions on 4 replicas: at least one replica idle, imbalance ≥ 4/3
    aff = summarise(
        inp,
        simulate(inp, Scenario(4, 4, 1000, "affinity"), DEFAULTS.simulation),
    )
    assert aff["request_imbalance"] >= 4 / 3
    assert len(aff["per_replica"]) == 4
    assert aff["hit_tokens"] == (12 - 3) * 8


def test_inferred_sessions_bring_a_conversation_home() -> None:
    # No session ids: conversations are inferred from the prefix chains (pipeline.prefix.sessions).
    rng = np.random.default_rng(0)
    rows = []
    convs = {c: [100 * c + 1, 100 * c + 2] for c in range(6)}
    for i in range(60):
        c = int(rng.integers(6))
        convs[c] = [*convs[c], 100 * c + len(convs[c]) + 1]
        rows.append({"t_ms": i, "hashes": list(convs[c]), "prompt_tokens": 4 * len(convs[c]) + 1})
    inp = sim_input(canonical(rows), latency_model=DEFAULTS.shape.latency)
    assert inp.sessions_inferred > 0
    aff = summarise(
        inp,
        simulate(inp, Scenario(4, 3, 10_000, "affinity"), DEFAULTS.simulation),
    )
    rr = summarise(
        inp,
        simulate(inp, Scenario(4, 3, 10_000, "round-robin"), DEFAULTS.simulation),
    )
    single = summarise(
        inp,
        simulate(inp, Scenario(4, 1, 10_000, "round-robin"), DEFAULTS.simulation),
    )
    assert aff["hit_tokens"] == single["hit_tokens"] > rr["hit_tokens"]
    assert aff["sessions_inferred"] == inp.sessions_inferred
