"""Prefix-cache replay: hand-computed rules, a straightforward reference, and the one-pass curve."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perf.sim_oracles import event_reference, lru_reference
from pipeline.schema import conform
from pipeline.sim.blocks import SimulationInputError, sim_input
from pipeline.sim.config import Scenario
from pipeline.sim.curve import capacity_curve
from pipeline.sim.replay import Assignment, assign, simulate
from tests.conftest import DEFAULTS, sim_settings

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def canonical(rows: list[dict[str, Any]], block_size: int) -> pl.DataFrame:
    """Rows: hashes, prompt_tokens, prompt_blocks (default: all hashes), output, session, tenant."""
    return conform(
        pl.DataFrame(
            {
                "request_id": [f"r{i}" for i in range(len(rows))],
                "arrival": [T0 + timedelta(seconds=r.get("t", i)) for i, r in enumerate(rows)],
                "session_id": [r.get("session") for r in rows],
                "tenant": [r.get("tenant") for r in rows],
                "prompt_tokens": [r["prompt_tokens"] for r in rows],
                "output_tokens": [r.get("output_tokens", 0) for r in rows],
                "e2e_ms": [r.get("e2e_ms") for r in rows],
                "block_size": [block_size] * len(rows),
                "prefix_hashes": [[int(h) for h in r["hashes"]] for r in rows],
                "prompt_blocks": [r.get("prompt_blocks", len(r["hashes"])) for r in rows],
                "hashes_known": [r.get("known", True) for r in rows],
            },
            schema_overrides={"prefix_hashes": pl.List(pl.UInt64)},
        )
    )


def hits(rows: list[dict[str, Any]], block_size: int, cache_tokens: int, **kw: Any) -> list[int]:
    """Hit tokens per request; ``stored`` (default ``block_size``) is the trace's block size;
    ``lifetime`` defaults to instant (the cache rules alone, nothing pinned)."""
    inp = sim_input(
        canonical(rows, kw.pop("stored", block_size)), latency_model=DEFAULTS.shape.latency
    )
    lifetime = kw.pop("lifetime", "instant")
    slots = kw.pop("replica_slots", None)
    sc = Scenario(block_size, kw.pop("replicas", 1), cache_tokens, **kw)
    run = simulate(inp, sc, sim_settings(request_lifetime=lifetime, replica_slots=slots))
    return [int(h) for h in run.hit_tokens]


# --------------------------------------------------------------------------------------------
# The references (perf/sim_oracles.py) fed straight from the rows: block keys are the hashes
# (with the tenant when isolated), unknown output blocks are what the tokens add beyond them.
# --------------------------------------------------------------------------------------------


def reference_blocks(
    rows: list[dict[str, Any]], block_size: int
) -> tuple[list[list[object]], list[int], list[int], list[int]]:
    chains: list[list[object]] = []
    prompt_blocks, anonymous, prompt_tokens = [], [], []
    for row in rows:
        known = row.get("known", True)
        key = (row.get("tenant"),) if row.get("isolate") else ()
        chain = [(*key, h) for h in row["hashes"]] if known else []
        chains.append(chain)
        prompt_blocks.append(row.get("prompt_blocks", len(row["hashes"])) if known else 0)
        total = (row["prompt_tokens"] + row.get("output_tokens", 0)) // block_size
        anonymous.append(max(0, total - len(chain)))
        prompt_tokens.append(row["prompt_tokens"])
    return chains, prompt_blocks, anonymous, prompt_tokens


def reference(
    rows: list[dict[str, Any]], block_size: int, capacity_blocks: int, replica: list[int]
) -> list[int]:
    """Instant lifetime: one OrderedDict LRU per replica."""
    chains, pb, anonymous, ptok = reference_blocks(rows, block_size)
    return lru_reference(
        chains, pb, anonymous, ptok, block_size, capacity_blocks, replica, max(replica) + 1
    )


def durations_reference(
    rows: list[dict[str, Any]],
    block_size: int,
    capacity_blocks: int,
    replica: list[int],
    replica_slots: int | None,
) -> list[int]:
    """Durations lifetime with logged e2e_ms: ref counts, releases in finish order."""
    chains, pb, anonymous, ptok = reference_blocks(rows, block_size)
    return event_reference(
        chains,
        pb,
        anonymous,
        ptok,
        block_size,
        capacity_blocks,
        arrival=[r.get("t", i) * 1_000_000 for i, r in enumerate(rows)],
        duration=[round(r["e2e_ms"] * 1000) for r in rows],
        replicas=max(replica) + 1,
        replica=replica,
        replica_slots=replica_slots,
    ).hit_tokens


# --------------------------------------------------------------------------------------------
# Hand-computed rules (B = 4 tokens per block)
# --------------------------------------------------------------------------------------------


def test_partial_block_never_hits() -> None:
    # 3 tokens: no full block, nothing to cache or hit, however often it repeats.
    rows = [{"hashes": [], "prompt_tokens": 3}] * 3
    assert hits(rows, 4, 1000, routing="round-robin") == [0, 0, 0]
    # 6 tokens = one full block + 2 tokens: the repeat hits the full block only (4 tokens).
    rows = [{"hashes": [11], "prompt_tokens": 6}] * 2
    assert hits(rows, 4, 1000, routing="round-robin") == [0, 4]


def test_last_token_is_always_recomputed() -> None:
    # 8 tokens = 2 full blocks, fully cached on the repeat. vLLM caps the hit at 8 - 1 = 7
    # tokens and keeps whole blocks: ⌊7 / 4⌋ = 1 block = 4 tokens (block 2 is recomputed).
    rows = [{"hashes": [1, 2], "prompt_tokens": 8}] * 2
    assert hits(rows, 4, 1000, routing="round-robin") == [0, 4]
    # 9 tokens: ⌊8 / 4⌋ = 2 blocks may hit, both do.
    rows = [{"hashes": [1, 2], "prompt_tokens": 9}] * 2
    assert hits(rows, 4, 1000, routing="round-robin") == [0, 8]
    # One token: nothing can hit (min(0, 0)).
    rows = [{"hashes": [], "prompt_tokens": 1}] * 2
    assert hits(rows, 4, 1000, routing="round-robin") == [0, 0]


def test_tail_first_insertion_keeps_the_head_under_eviction() -> None:
    # Three blocks into a 2-block cache: tail first, so the tail (block 3) is evicted and the
    # head survives; the repeat hits blocks 1 and 2 (8 tokens). Head-first would keep 2 and 3
    # and the repeat would miss at block 1.
    rows = [{"hashes": [1, 2, 3], "prompt_tokens": 13}] * 2
    assert hits(rows, 4, 8, routing="round-robin") == [0, 8]


def test_lru_evicts_least_recently_used() -> None:
    x = {"hashes": [100], "prompt_tokens": 5}
    y = {"hashes": [200], "prompt_tokens": 5}
    z = {"hashes": [300], "prompt_tokens": 5}
    # cache of 2 blocks: x, y, x (refresh x), z evicts y (not x); then x hits, y misses.
    assert hits([x, y, x, z, x, y], 4, 8, routing="round-robin") == [0, 0, 4, 0, 4, 0]


def test_unknown_output_blocks_occupy_capacity() -> None:
    a = {"hashes": [1], "prompt_tokens": 5}
    # b: 5 prompt + 8 output = 13 tokens = 3 full blocks, only 1 known: 2 unique blocks.
    b = {"hashes": [2], "prompt_tokens": 5, "output_tokens": 8}
    # 2-block cache: after b it holds {unknown, b}; a was pushed out, so a misses.
    assert hits([a, b, a], 4, 8, routing="round-robin") == [0, 0, 0]
    # Without the output, a survives.
    b0 = {"hashes": [2], "prompt_tokens": 5}
    assert hits([a, b0, a], 4, 8, routing="round-robin") == [0, 0, 4]


def test_known_output_blocks_can_be_hit_by_the_next_turn() -> None:
    # Turn 1: prompt 1 block + output 1 block (chain [1, 2]); turn 2's prompt is [1, 2, 3].
    t1 = {"hashes": [1, 2], "prompt_blocks": 1, "prompt_tokens": 4, "output_tokens": 4}
    t2 = {"hashes": [1, 2, 3], "prompt_tokens": 13}
    assert hits([t1, t2], 4, 1000, routing="round-robin") == [0, 8]


def test_count_only_rows_share_nothing() -> None:
    rows = [{"hashes": [1, 2], "prompt_tokens": 9, "known": False}] * 2
    assert hits(rows, 4, 1000, routing="round-robin") == [0, 0]


def test_round_robin_scatters_a_conversation_and_affinity_returns_it() -> None:
    turns = [
        {"hashes": [1, 2], "prompt_tokens": 9, "session": "c"},
        {"hashes": [1, 2, 3], "prompt_tokens": 13, "session": "c"},
        {"hashes": [1, 2, 3, 4], "prompt_tokens": 17, "session": "c"},
    ]
    # round-robin over 2: turn 2 lands on replica 1 (cold), turn 3 back on replica 0 (turn 1).
    assert hits(turns, 4, 1000, replicas=2, routing="round-robin") == [0, 0, 8]
    # affinity: every turn meets the previous one.
    assert hits(turns, 4, 1000, replicas=2, routing="affinity") == [0, 8, 12]


def test_tenant_isolation_separates_identical_prompts() -> None:
    rows = [
        {"hashes": [1, 2], "prompt_tokens": 9, "tenant": "a"},
        {"hashes": [1, 2], "prompt_tokens": 9, "tenant": "b"},
        {"hashes": [1, 2], "prompt_tokens": 9, "tenant": "a"},
    ]
    assert hits(rows, 4, 1000, routing="round-robin") == [0, 8, 8]
    assert hits(rows, 4, 1000, routing="round-robin", tenant_isolation=True) == [0, 0, 8]


def test_coarser_block_size_strides_the_chain() -> None:
    # Stored B=4; at B=8 block k is stored block 2k+1. Prompt of 13 tokens → 1 full 8-block.
    rows = [
        {"hashes": [1, 2, 3], "prompt_tokens": 13},
        {"hashes": [1, 2, 9], "prompt_tokens": 13},
        {"hashes": [1, 7, 9], "prompt_tokens": 13},
    ]
    assert hits(rows, 8, 1000, stored=4, routing="round-robin") == [0, 8, 0]
    with pytest.raises(SimulationInputError, match="multiple"):
        hits(rows, 6, 1000, stored=4, routing="round-robin")


def test_bad_input_names_the_request() -> None:
    rows = [{"hashes": [1], "prompt_blocks": 2, "prompt_tokens": 9}]
    with pytest.raises(SimulationInputError, match="'r0'"):
        sim_input(canonical(rows, 4), latency_model=DEFAULTS.shape.latency)


# --------------------------------------------------------------------------------------------
# Token-level construction for the striding test: hash real token sequences at two sizes
# --------------------------------------------------------------------------------------------


def chain_hashes(tokens: list[int], block_size: int) -> list[int]:
    out: list[int] = []
    parent = b"root"
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = ",".join(map(str, tokens[start : start + block_size])).encode()
        digest = hashlib.blake2b(parent + b"|" + block, digest_size=8).digest()
        out.append(int.from_bytes(digest, "little"))
        parent = digest
    return out


def token_workload(seed: int, n: int, base: int) -> list[list[int]]:
    """Conversations that grow by appending, plus shared system prompts."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, 50, size=int(rng.integers(0, 3 * base))).tolist() for _ in range(3)]
    convs: list[list[int]] = []
    prompts = []
    for _ in range(n):
        if convs and rng.random() < 0.6:
            c = int(rng.integers(len(convs)))
            convs[c] = convs[c] + rng.integers(0, 50, size=int(rng.integers(1, 3 * base))).tolist()
            prompts.append(convs[c])
        else:
            new = (
                systems[int(rng.integers(3))]
                + rng.integers(0, 50, size=int(rng.integers(1, 4 * base))).tolist()
            )
            convs.append(new)
            prompts.append(new)
    return prompts


@pytest.mark.parametrize("multiple", [2, 3])
def test_strided_block_size_equals_hashing_at_that_size(multiple: int) -> None:
    base = 4
    prompts = token_workload(7, 60, base)
    stored = [
        {"hashes": chain_hashes(p, base), "prompt_tokens": len(p), "output_tokens": 3}
        for p in prompts
    ]
    direct = [
        {"hashes": chain_hashes(p, base * multiple), "prompt_tokens": len(p), "output_tokens": 3}
        for p in prompts
    ]
    for cap_blocks in (1, 3, 8, 1000):
        got = hits(
            stored,
            base * multiple,
            cap_blocks * base * multiple,
            stored=base,
            routing="round-robin",
        )
        assert got == reference(direct, base * multiple, cap_blocks, [0] * len(prompts))


# --------------------------------------------------------------------------------------------
# Random workloads against the reference, monotonicity, single replica, curve equality
# --------------------------------------------------------------------------------------------


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[dict[str, Any]], int]:
    """Requests whose chains are root paths of a random prefix tree (chained-hash structure)."""
    block_size = draw(st.sampled_from([1, 2, 4]))
    n_nodes = draw(st.integers(1, 25))
    parent = [-1] + [draw(st.integers(-1, i - 1)) for i in range(1, n_nodes)]
    n = draw(st.integers(1, 30))
    rows: list[dict[str, Any]] = []
    for i in range(n):
        node = draw(st.integers(0, n_nodes - 1))
        path = []
        while node >= 0:
            path.append(node + 1000)
            node = parent[node]
        path.reverse()
        prompt_blocks = draw(st.integers(0, len(path)))
        extra = draw(st.integers(0, block_size))
        prompt_tokens = prompt_blocks * block_size + (extra if prompt_blocks < len(path) else 0)
        prompt_tokens = max(prompt_tokens, prompt_blocks * block_size)
        known_output_blocks = len(path) - prompt_blocks
        output = known_output_blocks * block_size + draw(st.integers(0, 3 * block_size))
        if known_output_blocks and prompt_tokens % block_size:
            # known output blocks require the prompt to end on a block boundary
            prompt_tokens = prompt_blocks * block_size
        rows.append(
            {
                "hashes": path,
                "prompt_blocks": prompt_blocks,
                "prompt_tokens": prompt_tokens,
                "output_tokens": output,
                "session": f"s{draw(st.integers(0, 4))}",
                "tenant": draw(st.sampled_from(["a", "b"])),
                "e2e_ms": float(draw(st.integers(0, 5000))),
                "t": i * draw(st.integers(0, 2)),
            }
        )
    rows.sort(key=lambda r: r["t"])
    return rows, block_size


ROUTED = ["round-robin", "random", "least-loaded", "least-served", "affinity", "bounded-affinity"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    workloads(),
    st.integers(0, 12),
    st.integers(1, 3),
    st.sampled_from(ROUTED),
    st.sampled_from([None, 1, 2]),
)
def test_replay_matches_reference(
    case: tuple[list[dict[str, Any]], int],
    cap: int,
    replicas: int,
    routing: str,
    slots: int | None,
) -> None:
    rows, bs = case
    inp = sim_input(canonical(rows, bs), latency_model=DEFAULTS.shape.latency)
    a = assign(inp, routing, replicas, sim_settings(random_seed=3, replica_slots=slots))
    sc = Scenario(bs, replicas, cap * bs, routing)
    run = simulate(inp, sc, sim_settings(replica_slots=slots), assignment=a)
    assert run.request_lifetime == "durations"
    assert run.hit_tokens.tolist() == durations_reference(rows, bs, cap, a.replica.tolist(), slots)
    assert run.hit_tokens_instant is not None
    assert run.hit_tokens_instant.tolist() == reference(rows, bs, cap, a.replica.tolist())
    # isolation: the reference keys blocks by (tenant, hash)
    iso = simulate(
        inp,
        Scenario(bs, replicas, cap * bs, routing, True),
        sim_settings(replica_slots=slots),
        assignment=a,
    )
    isolated_rows = [{**r, "isolate": True} for r in rows]
    assert iso.hit_tokens.tolist() == durations_reference(
        isolated_rows, bs, cap, a.replica.tolist(), slots
    )
    assert iso.hit_tokens_instant is not None
    assert iso.hit_tokens_instant.tolist() == reference(isolated_rows, bs, cap, a.replica.tolist())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.integers(1, 3), st.sampled_from(ROUTED))
def test_hits_never_decrease_with_capacity(
    case: tuple[list[dict[str, Any]], int], replicas: int, routing: str
) -> None:
    rows, bs = case
    inp = sim_input(canonical(rows, bs), latency_model=DEFAULTS.shape.latency)
    a = assign(inp, routing, replicas, sim_settings(random_seed=1))
    for lifetime in ("instant", "durations"):
        totals = [
            int(
                simulate(
                    inp,
                    Scenario(bs, replicas, c * bs, routing),
                    sim_settings(request_lifetime=lifetime),
                    assignment=a,
                    with_instant=False,
                ).hit_tokens.sum()
            )
            for c in range(0, 25)
        ]
        assert totals == sorted(totals)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.integers(0, 12), st.sampled_from([*ROUTED, "cache-aware"]))
def test_one_replica_with_any_routing_is_the_single_cache(
    case: tuple[list[dict[str, Any]], int], cap: int, routing: str
) -> None:
    rows, bs = case
    inp = sim_input(canonical(rows, bs), latency_model=DEFAULTS.shape.latency)
    for lifetime in ("instant", "durations"):
        single = simulate(
            inp, Scenario(bs, 1, cap * bs, "round-robin"), sim_settings(request_lifetime=lifetime)
        ).hit_tokens
        routed = simulate(
            inp, Scenario(bs, 1, cap * bs, routing), sim_settings(request_lifetime=lifetime)
        )
        assert routed.hit_tokens.tolist() == single.tolist()
    instant = simulate(
        inp, Scenario(bs, 1, cap * bs, routing), sim_settings(request_lifetime="instant")
    )
    assert instant.hit_tokens.tolist() == reference(rows, bs, cap, [0] * len(rows))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.integers(1, 3), st.sampled_from(ROUTED), st.booleans())
def test_curve_equals_direct_simulation_at_every_capacity(
    case: tuple[list[dict[str, Any]], int], replicas: int, routing: str, isolation: bool
) -> None:
    rows, bs = case
    inp = sim_input(canonical(rows, bs), latency_model=DEFAULTS.shape.latency)
    curve = capacity_curve(
        inp,
        sim_settings(tenant_isolation=isolation, random_seed=2),
        block_size=bs,
        replicas=replicas,
        routing=routing,
    )
    a = assign(inp, routing, replicas, sim_settings(random_seed=2))
    top = int(curve.capacity_blocks[-1]) + 3 if curve.capacity_blocks.size else 3
    for cap in range(0, top):
        sc = Scenario(bs, replicas, cap * bs, routing, isolation)
        run = simulate(inp, sc, sim_settings(request_lifetime="instant"), assignment=a)
        assert curve.hit_tokens_at(cap * bs) == int(run.hit_tokens.sum()), cap


def test_curve_on_a_larger_random_workload_at_many_capacities() -> None:
    rng = np.random.default_rng(11)
    prompts = token_workload(3, 400, 4)
    rows = [
        {
            "hashes": chain_hashes(p, 4),
            "prompt_tokens": len(p),
            "output_tokens": int(rng.integers(0, 12)),
            "session": f"s{i % 17}",
        }
        for i, p in enumerate(prompts)
    ]
    inp = sim_input(canonical(rows, 4), latency_model=DEFAULTS.shape.latency)
    for replicas, routing in ((1, "round-robin"), (3, "affinity"), (4, "round-robin")):
        curve = capacity_curve(
            inp, DEFAULTS.simulation, block_size=4, replicas=replicas, routing=routing
        )
        a = assign(inp, routing, replicas, DEFAULTS.simulation)
        caps = np.unique(np.concatenate([curve.capacity_blocks, curve.capacity_blocks - 1]))
        for cap in [*caps[::7].tolist(), int(caps[-1])]:
            sc = Scenario(4, replicas, int(cap) * 4, routing)
            assert curve.hit_tokens_at(int(cap) * 4) == int(
                simulate(
                    inp, sc, sim_settings(request_lifetime="instant"), assignment=a
                ).hit_tokens.sum()
            )


def test_shards_sampling_tracks_the_exact_curve() -> None:
    # Many conversations and no dominant shared prefix (SHARDS' error grows when a few hot
    # blocks carry most hits). Sampled distances are scaled, so compare from 64 blocks up.
    rng = np.random.default_rng(5)
    convs: list[list[int]] = [[] for _ in range(400)]
    rows = []
    for _ in range(6000):
        c = int(rng.integers(len(convs)))
        convs[c] = convs[c] + rng.integers(0, 1000, size=int(rng.integers(1, 24))).tolist()
        rows.append({"hashes": chain_hashes([c, *convs[c]], 4), "prompt_tokens": len(convs[c]) + 1})
    inp = sim_input(canonical(rows, 4), latency_model=DEFAULTS.shape.latency)
    exact = capacity_curve(
        inp, DEFAULTS.simulation, block_size=4, replicas=1, routing="round-robin"
    )
    sampled = capacity_curve(
        inp,
        DEFAULTS.simulation,
        block_size=4,
        sample_rate=0.25,
        sample_salt=1,
        replicas=1,
        routing="round-robin",
    )
    assert sampled.sample_rate == 0.25 and not sampled.as_dict()["exact"]
    caps = np.geomspace(256, exact.saturation_cache_tokens, 12).astype(int)
    errors = [abs(exact.hit_ratio_at(int(c)) - sampled.hit_ratio_at(int(c))) for c in caps]
    assert max(errors) < 0.03


def test_explicit_assignment_must_cover_every_request() -> None:
    rows = [{"hashes": [1], "prompt_tokens": 5}] * 3
    inp = sim_input(canonical(rows, 4), latency_model=DEFAULTS.shape.latency)
    with pytest.raises(SimulationInputError, match="length"):
        simulate(
            inp,
            Scenario(4, 2, 100, "round-robin"),
            DEFAULTS.simulation,
            assignment=Assignment(np.zeros(2, np.int64)),
        )


def test_non_chained_ids_fall_back_to_membership_tests() -> None:
    # Block ids that do not form a chain (id 5 follows different parents, id 7 repeats inside
    # one request): the replay must still be an exact LRU, like the reference.
    # Durations overlap (1 s apart, 2.5 s each), so the durations lifetime pins an id twice.
    rows = [
        {"hashes": [1, 5, 7, 7], "prompt_tokens": 17},
        {"hashes": [2, 5], "prompt_tokens": 9},
        {"hashes": [5, 1], "prompt_tokens": 9},
        {"hashes": [1, 5, 7], "prompt_tokens": 13},
        {"hashes": [7, 5, 2], "prompt_tokens": 13, "output_tokens": 9},
        {"hashes": [2, 5, 1], "prompt_tokens": 13},
    ]
    rows = [{**r, "e2e_ms": 2500.0} for r in rows]
    inp = sim_input(canonical(rows, 4), latency_model=DEFAULTS.shape.latency)
    assert not inp.blocks(4).chained
    for cap in range(0, 8):
        run = simulate(
            inp, Scenario(4, 1, cap * 4, "round-robin"), sim_settings(replica_slots=None)
        )
        assert run.hit_tokens.tolist() == durations_reference(rows, 4, cap, [0] * 6, None), cap
        assert run.hit_tokens_instant is not None
        assert run.hit_tokens_instant.tolist() == reference(rows, 4, cap, [0] * len(rows)), cap
    chained = sim_input(
        canonical([{"hashes": [1, 2], "prompt_tokens": 9}] * 2, 4),
        latency_model=DEFAULTS.shape.latency,
    )
    assert chained.blocks(4).chained


def test_curve_refuses_ids_that_are_not_chains() -> None:
    rows = [{"hashes": [1, 5], "prompt_tokens": 9}, {"hashes": [2, 5], "prompt_tokens": 9}]
    with pytest.raises(SimulationInputError, match="hash chains"):
        capacity_curve(
            sim_input(canonical(rows, 4), latency_model=DEFAULTS.shape.latency),
            DEFAULTS.simulation,
            block_size=4,
            replicas=1,
            routing="round-robin",
        )


def test_a_lazy_table_is_flattened_from_the_replay_columns_alone(tmp_path: Any) -> None:
    """Scanned from Parquet, only the columns a replay reads are loaded, and the flattened
    input (chains, counts, durations, inferred sessions) equals the eager table's."""
    rows = [
        {"hashes": [1, 2], "prompt_tokens": 9},
        {"hashes": [1, 2, 3], "prompt_tokens": 13, "t": 5},
        {"hashes": [7], "prompt_tokens": 5, "known": False, "t": 6},
        {"hashes": [1, 2, 3, 4], "prompt_tokens": 17, "t": 9},
    ]
    table = canonical(rows, 4).with_columns(pl.lit("x" * 200).alias("source_file"))
    path = tmp_path / "requests.parquet"
    table.write_parquet(path)
    lazy = pl.scan_parquet(path)
    latency = DEFAULTS.shape.latency
    eager, scanned = sim_input(table, latency_model=latency), sim_input(lazy, latency_model=latency)
    for name in (
        "offsets",
        "hashes",
        "prompt_blocks",
        "prompt_tokens",
        "arrival_us",
        "duration_us",
    ):
        assert np.array_equal(getattr(eager, name), getattr(scanned, name)), name
    assert np.array_equal(eager.session_hash, scanned.session_hash)
    assert eager.sessions_inferred == scanned.sessions_inferred
    assert len(set(eager.session_hash[[0, 1, 3]].tolist())) == 1  # one conversation inferred
