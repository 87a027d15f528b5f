"""vLLM's hit limit and the cache namespaces (pipeline.prefix.cache_rules), and that the simulation and
the prefix stage's reuse replay both apply them."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import polars as pl

from pipeline.prefix.cache_rules import hit_limit_blocks, namespace_codes, namespaced_ids
from pipeline.schema import conform
from pipeline.sim.blocks import sim_input
from pipeline.sim.config import Scenario
from pipeline.sim.replay import simulate
from tests.conftest import DEFAULTS
from tests.prefix_oracles import reuse_per_request

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
B = 4


def test_hit_limit_is_whole_blocks_below_the_last_token() -> None:
    # ⌊(P - 1) / 4⌋: 8 tokens = exactly 2 blocks -> 1; 9 -> 2; 1..4 -> 0; 0 -> 0; 5 -> 1.
    prompt = np.array([0, 1, 4, 5, 8, 9, 12, 13, 16], np.int64)
    assert hit_limit_blocks(prompt, 4).tolist() == [0, 0, 0, 1, 1, 2, 2, 3, 3]
    assert hit_limit_blocks(prompt, 1).tolist() == [0, 0, 3, 4, 7, 8, 11, 12, 15]
    assert hit_limit_blocks([1024, 1025], 512).tolist() == [1, 2]


def test_namespace_codes_count_nulls_as_a_value() -> None:
    frame = pl.DataFrame(
        {
            "model": [None, "m", "", None, "m", "m"],
            "lora_adapter": [None, None, None, "x", None, "x"],
            "tenant": ["a", "b", "a", "a", "a", None],
        }
    )
    # (null,null) (m,null) ("",null) (null,x) (m,null) (m,x)
    assert namespace_codes(frame).tolist() == [0, 1, 2, 3, 1, 4]
    # with the tenant: (m,null,b) and (m,null,a) now differ
    assert namespace_codes(frame, tenant_isolation=True).tolist() == [0, 1, 2, 3, 4, 5]
    # absent columns are all null: one namespace
    assert namespace_codes(pl.DataFrame({"x": [1, 2]})).tolist() == [0, 0]


def test_namespaced_ids_are_exact_and_identity_for_one_namespace() -> None:
    ids = np.array([0, 1, 0, 1, 2, 0], np.int32)
    offsets = np.array([0, 2, 4, 6], np.int64)
    same, n = namespaced_ids(ids, offsets, np.zeros(3, np.int64), 3)
    assert same is ids and n == 3
    # request 1 in another namespace: its blocks 0, 1 become new ids; request 2 shares with 0
    keyed, n = namespaced_ids(ids, offsets, np.array([0, 1, 0], np.int64), 3)
    assert keyed.tolist() == [0, 1, 2, 3, 4, 0]
    assert n == 5


def _rows(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return conform(
        pl.DataFrame(
            {
                "request_id": [f"r{i}" for i in range(len(rows))],
                "arrival": [T0 + dt.timedelta(seconds=i) for i in range(len(rows))],
                "model": [r.get("model") for r in rows],
                "lora_adapter": [r.get("lora") for r in rows],
                "tenant": [r.get("tenant") for r in rows],
                "prompt_tokens": [9] * len(rows),
                "output_tokens": [0] * len(rows),
                "block_size": [B] * len(rows),
                "prefix_hashes": [[1, 2]] * len(rows),
                "prompt_blocks": [2] * len(rows),
                "hashes_known": [True] * len(rows),
            },
            schema_overrides={"prefix_hashes": pl.List(pl.UInt64)},
        )
    )


# The same 9-token prompt (2 full blocks, both may hit: 8 tokens) sent five times.
MIXED = [
    {"model": "m1"},
    {"model": "m1", "lora": "sql"},  # adapter differs from r0: cold
    {"model": "m2"},  # model differs: cold
    {"model": "m1", "lora": "sql", "tenant": "t"},  # meets r1
    {},  # null model: a namespace of its own, cold
]


def test_simulation_never_shares_blocks_across_models_or_adapters() -> None:
    inp = sim_input(_rows(MIXED), latency_model=DEFAULTS.shape.latency)
    run = simulate(inp, Scenario(B, 1, 1000, "round-robin"), DEFAULTS.simulation)
    assert run.hit_tokens.tolist() == [0, 0, 0, 8, 0]
    # with tenant isolation r3 (tenant t) no longer meets r1 (no tenant)
    iso = simulate(
        inp, Scenario(B, 1, 1000, "round-robin", tenant_isolation=True), DEFAULTS.simulation
    )
    assert iso.hit_tokens.tolist() == [0, 0, 0, 0, 0]
    # one model, no adapter: every repeat hits
    plain = sim_input(_rows([{"model": "m1"}] * 3), latency_model=DEFAULTS.shape.latency)
    assert simulate(
        plain, Scenario(B, 1, 1000, "round-robin"), DEFAULTS.simulation
    ).hit_tokens.tolist() == [0, 8, 8]


def test_reuse_replay_never_shares_blocks_across_models_or_adapters() -> None:
    per = reuse_per_request(_rows(MIXED), B)
    assert per["hit_blocks"].to_list() == [0, 0, 0, 2, 0]
    assert per["hit_tokens"].to_list() == [0, 0, 0, 8, 0]
