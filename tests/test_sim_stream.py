"""Scenarios streamed chunk by chunk (pipeline.sim.stream) against the one-pass replay of the
whole table (pipeline.sim.replay.simulate): the same summaries and per-replica rows for every
routing, both request lifetimes, one and four replicas, small chunks that cut through running
requests; and block state bounded by the caches, not by the distinct blocks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from perf.workload import canonical_frame, conversations, spec
from pipeline.sim import blocks, compute, kernels, slots, stage
from pipeline.sim.blocks import SimInputs, SimulationInputError, sim_input
from pipeline.sim.config import ROUTINGS, Scenario
from pipeline.sim.replay import simulate, summarise
from pipeline.sim.result import ScenarioSummary, replica_frame, scenario_frame
from pipeline.sim.stream import (
    RequestChunks,
    RequestStream,
    StreamedRun,
    frame_chunks,
    simulate_streamed,
)
from pipeline.store import scan_requests
from tests.conftest import DEFAULTS, sim_settings
from tests.test_sim_lifetimes import B, canonical

LATENCY = DEFAULTS.simulation.latency(DEFAULTS.shape.latency)
PARTS = 4
# Small slices of each part: a chunk boundary every 97 requests, with requests running across.
SLICE = 97


def _workload(sessions_logged: str) -> pl.DataFrame:
    """1,600 generated requests (3 tenants, 2 models, 5 per second: about a dozen running at
    once); session ids logged for all, half (the rest inferred) or none of them."""
    c = conversations(spec(1600, "short", tenants=3, models=2, rate_rps=5.0, seed=3))
    frame = canonical_frame(c, 16, sessions=sessions_logged != "none")
    if sessions_logged == "half":
        half = pl.int_range(pl.len()) % 2 == 0
        frame = frame.with_columns(pl.when(half).then(pl.col("session_id")).alias("session_id"))
    return frame


def _parts(frame: pl.DataFrame, folder: Path, parts: int = PARTS) -> RequestChunks:
    """``frame`` written as ``parts`` Parquet parts in arrival order, scanned one at a time."""
    files = []
    rows = -(-frame.height // parts)
    for i in range(parts):
        path = folder / f"part-{i:05d}.parquet"
        frame.slice(i * rows, rows).write_parquet(path)
        files.append(path)
    return lambda: (scan_requests(path) for path in files)


@pytest.fixture(scope="module")
def workloads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[SimInputs, Any]]:
    out = {}
    for logged in ("all", "half"):
        frame = _workload(logged)
        folder = tmp_path_factory.mktemp(f"parts-{logged}")
        out[logged] = (sim_input(frame, latency_model=LATENCY), _parts(frame, folder))
    return out


def _assert_same(one_pass: dict[str, Any], streamed: StreamedRun) -> None:
    assert json.dumps(streamed.summary, sort_keys=True) == json.dumps(one_pass, sort_keys=True)
    a, b = ScenarioSummary.from_json(one_pass), ScenarioSummary.from_json(streamed.summary)
    assert_frame_equal(scenario_frame([b]), scenario_frame([a]))
    assert_frame_equal(replica_frame([b]), replica_frame([a]))


CASES = [
    (routing, replicas, lifetime)
    for routing in ROUTINGS
    for replicas in (1, 4)
    for lifetime in ("durations", "instant")
    if replicas > 1 or routing in ("round-robin", "affinity")
]


@pytest.mark.parametrize(("routing", "replicas", "lifetime"), CASES)
def test_streamed_scenario_equals_the_one_pass_replay(
    workloads: dict[str, tuple[SimInputs, Any]],
    routing: str,
    replicas: int,
    lifetime: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inp, parts = workloads["half"]
    settings = sim_settings(request_lifetime=lifetime, replica_slots=4)
    scenario = Scenario(
        block_size=32,
        replicas=replicas,
        cache_tokens=32 * 60,
        routing=routing,
        tenant_isolation=routing == "round-robin",
    )
    one_pass = summarise(inp, simulate(inp, scenario, settings))
    assert one_pass["hit_tokens"] > 0
    by_part = simulate_streamed(parts, scenario, settings, latency_model=LATENCY)
    # slices on tables that start tiny: slots reclaimed and tables grown again and again
    monkeypatch.setattr(slots, "MIN_SLOTS", 8)
    sliced = simulate_streamed(parts, scenario, settings, latency_model=LATENCY, max_rows=SLICE)
    assert (by_part.chunks, sliced.chunks) == (PARTS, PARTS * -(-400 // SLICE))
    if lifetime == "durations" or (replicas > 1 and routing in ("least-loaded", "cache-aware")):
        assert sliced.peak_running > 0  # requests ran across chunk boundaries
    _assert_same(one_pass, by_part)
    _assert_same(one_pass, sliced)


@pytest.mark.parametrize("routing", ["affinity", "bounded-affinity"])
def test_logged_sessions_are_read_chunk_by_chunk(
    workloads: dict[str, tuple[SimInputs, Any]], routing: str
) -> None:
    inp, parts = workloads["all"]
    settings = sim_settings(request_lifetime="durations", replica_slots=4)
    scenario = Scenario(block_size=16, replicas=4, cache_tokens=16 * 100, routing=routing)
    one_pass = summarise(inp, simulate(inp, scenario, settings))
    assert one_pass["sessions_inferred"] == 0
    _assert_same(one_pass, simulate_streamed(parts, scenario, settings, latency_model=LATENCY))


def test_half_the_sessions_are_inferred_chunk_by_chunk_as_over_the_whole_table(
    workloads: dict[str, tuple[SimInputs, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    inp, parts = workloads["half"]
    settings = sim_settings(request_lifetime="instant")
    scenario = Scenario(block_size=16, replicas=4, cache_tokens=16 * 100, routing="affinity")
    one_pass = summarise(inp, simulate(inp, scenario, settings))
    assert one_pass["sessions_inferred"] > 0
    # the streamed replay never infers over a whole table: the inference's state is carried
    monkeypatch.setattr(blocks, "infer_sessions", lambda frame: pytest.fail("whole table"))
    streamed = simulate_streamed(parts, scenario, settings, latency_model=LATENCY, max_rows=SLICE)
    _assert_same(one_pass, streamed)


def test_block_state_is_bounded_by_the_caches_not_the_distinct_blocks() -> None:
    """Many more distinct blocks than the caches hold: after every chunk the live blocks are
    at most replicas × capacity plus the blocks running requests pin."""
    c = conversations(spec(3000, "short", rate_rps=5.0, system_prompts=400, zipf=0.6, seed=9))
    frame = canonical_frame(c, 16)
    inp = sim_input(frame, latency_model=LATENCY)
    capacity, replicas = 50, 4
    for lifetime in ("durations", "instant"):
        settings = sim_settings(request_lifetime=lifetime, replica_slots=8)
        scenario = Scenario(
            block_size=16, replicas=replicas, cache_tokens=16 * capacity, routing="cache-aware"
        )
        run = simulate_streamed(
            frame_chunks(frame, 150), scenario, settings, latency_model=LATENCY, with_instant=False
        )
        _assert_same(summarise(inp, simulate(inp, scenario, settings, with_instant=False)), run)
        bound = replicas * capacity + run.peak_pinned_total
        assert run.peak_live_blocks <= bound
        if lifetime == "instant":
            assert run.peak_pinned_total == 0
        assert run.distinct_blocks > 20 * bound
        # rows: the cached and pinned blocks and one chunk's, half as much again to spare
        assert run.peak_state_rows <= 1.5 * (bound + run.peak_chunk_blocks) + slots.MIN_SLOTS
        assert run.peak_state_rows < run.distinct_blocks / 5


def test_a_part_without_prompt_content_takes_the_tables_block_size(tmp_path: Path) -> None:
    """A middle part of count-only requests (no block size, no chains: they occupy the caches,
    never match) between parts with content: as the one-pass replay of the whole table."""
    frame = _workload("all").head(900)
    count_only = frame.slice(300, 300).with_columns(
        pl.lit(None, pl.Int32).alias("block_size"),
        pl.lit(None, pl.List(pl.UInt64)).alias("prefix_hashes"),
        pl.lit(None, pl.Int32).alias("prompt_blocks"),
        pl.lit(False).alias("hashes_known"),
    )
    table = pl.concat([frame.head(300), count_only, frame.slice(600)])
    inp = sim_input(table, latency_model=LATENCY)
    settings = sim_settings(request_lifetime="durations", replica_slots=4)
    scenario = Scenario(block_size=16, replicas=4, cache_tokens=1600, routing="least-loaded")
    one_pass = summarise(inp, simulate(inp, scenario, settings))
    assert 0 < one_pass["content_share"] < 1
    streamed = simulate_streamed(
        _parts(table, tmp_path, 3), scenario, settings, latency_model=LATENCY
    )
    _assert_same(one_pass, streamed)


def test_the_stage_runs_every_scenario_streamed_in_one_pass(
    workloads: dict[str, tuple[SimInputs, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``stage.run`` on a :class:`RequestStream` (every configured scenario in one pass over the
    parts, the curves from the flattened table) writes what it writes from the flattened table;
    the scenarios of one replica count share slot tables (started tiny: reclaimed and grown)."""
    inp, parts = workloads["all"]
    settings = sim_settings()
    flat = stage.run(inp, settings)
    monkeypatch.setattr(slots, "MIN_SLOTS", 8)
    curved = stage.capacity_curves(inp, settings)  # the curves from the flattened table
    streamed = stage.run(RequestStream(parts, LATENCY, 150), settings, curved)
    assert len(flat.summaries) == 8
    assert_frame_equal(scenario_frame(streamed.summaries), scenario_frame(flat.summaries))
    assert_frame_equal(replica_frame(streamed.summaries), replica_frame(flat.summaries))
    assert streamed.curve_points == flat.curve_points
    one = settings.scenarios()[3]
    assert compute.scenario_summary(RequestStream(parts, LATENCY), one, settings) == (
        compute.scenario_summary(inp, one, settings)
    )


def test_chunks_out_of_arrival_order_are_refused() -> None:
    frame = _workload("none").head(300)
    late_first = [frame.slice(150).lazy(), frame.head(150).lazy()]
    scenario = Scenario(block_size=16, replicas=1, cache_tokens=1600, routing="round-robin")
    with pytest.raises(SimulationInputError, match="arrives before the end of the previous"):
        simulate_streamed(lambda: late_first, scenario, sim_settings(), latency_model=LATENCY)


def test_a_block_size_that_changes_between_chunks_is_refused() -> None:
    frame = _workload("none").head(300)
    other = frame.slice(150).with_columns(pl.lit(8, pl.Int32).alias("block_size"))
    chunks = [frame.head(150).lazy(), other.lazy()]
    scenario = Scenario(block_size=32, replicas=1, cache_tokens=1600, routing="round-robin")
    with pytest.raises(
        SimulationInputError, match=r"one value for the whole table, found \[8, 16\]"
    ):
        simulate_streamed(lambda: chunks, scenario, sim_settings(), latency_model=LATENCY)


def test_replay_chunk_checks_its_block_ids_and_heap() -> None:
    """The streamed kernel keeps the bounds checks: an id past the state's rows, or a running
    request outside the carried ones, is refused before numba runs."""
    state = np.full((3, 2), kernels.NOT_CACHED, np.int32)
    buf = np.zeros((2, 16), np.int32)
    queue = np.zeros((2, 5), np.int64)
    one = np.ones(1, np.int64)
    zero = np.zeros(1, np.int64)

    def call(ids: list[int], finishing: list[int], n_running: int, first: int) -> Any:
        return kernels.replay_chunk(
            np.array([0, len(ids)], np.int64),
            np.array(ids, np.int32),
            one * 0,
            zero,
            zero,
            one * 20,
            16,
            zero,
            one,
            first,
            kernels.FIXED,
            2,
            False,
            0,
            0,
            0.5,
            32,
            1.5,
            state,
            buf,
            queue,
            zero.copy(),
            np.zeros(2, np.int64),
            np.array(finishing + [0] * (2 - len(finishing)), np.int64),
            n_running,
            np.zeros(2, np.int64),
        )

    with pytest.raises(kernels.KernelArgumentError, match=r"block ids must lie in 0\.\.2"):
        call([0, 3], [], 0, 0)
    with pytest.raises(kernels.KernelArgumentError, match="running requests must be among"):
        call([0, 1], [1], 1, 1)
    hits, shed, balance, running = call([0, 1], [], 0, 0)
    assert (hits.tolist(), shed.tolist(), balance, running) == ([0], [False], 0, 1)


def test_a_block_evicted_at_a_chunk_boundary_and_seen_again_takes_a_fresh_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 2-block cache, one request a chunk, tables of 4 slots: r1 evicts r0's blocks [1, 2];
    the next chunk's r2 finds no room, so their slots are reclaimed (the table grows too), and
    [1, 2] come back in them uncached (r2 misses); r3 then hits them."""
    frame = canonical(
        [
            {"t_ms": t, "hashes": hashes, "e2e_ms": 0.5}  # each done before the next
            for t, hashes in enumerate([[1, 2], [3, 4], [1, 2], [1, 2, 5]])
        ]
    )
    inp = sim_input(frame, latency_model=LATENCY)
    reclaimed: list[tuple[int, int]] = []
    reclaim = slots.reclaim

    def counted(index: Any, hashes: Any, spaces: Any, cursor: Any, state: Any, keys: int) -> int:
        used = int(cursor[2])
        live = int(reclaim(index, hashes, spaces, cursor, state, keys))
        reclaimed.append((used, live))
        return live

    monkeypatch.setattr(slots, "MIN_SLOTS", 4)
    monkeypatch.setattr(slots, "reclaim", counted)
    for lifetime in ("instant", "durations"):
        settings = sim_settings(request_lifetime=lifetime)
        scenario = Scenario(block_size=B, replicas=1, cache_tokens=2 * B, routing="round-robin")
        one_pass = simulate(inp, scenario, settings)
        assert one_pass.hit_tokens.tolist() == [0, 0, 0, 2 * B]
        reclaimed.clear()
        streamed = simulate_streamed(
            frame_chunks(frame, 2), scenario, settings, latency_model=LATENCY
        )
        _assert_same(summarise(inp, one_pass), streamed)
        assert reclaimed[0] == (4, 2)  # [1, 2] were cached nowhere: their slots freed
        assert streamed.peak_state_rows > 4  # and the table grew


def test_block_slots_keep_a_cached_block_in_its_slot_and_free_the_others() -> None:
    """Random keys (two namespaces sharing hashes), random caching: a key keeps its slot while
    its block is cached somewhere, no two keys ever hold one slot, a key found again after its
    block went uncached everywhere comes back uncached, and the table grows from 4 slots."""
    rng = np.random.default_rng(5)
    table = slots.BlockSlots(replicas=2, replays=2, slots=4)
    held: dict[tuple[int, int], int] = {}
    for _ in range(300):
        n = int(rng.integers(1, 40))
        keys = rng.integers(1, 200, n).astype(np.uint64)
        spaces = rng.integers(0, 2, n).astype(np.int64)
        pairs = list(dict.fromkeys(zip(keys.tolist(), spaces.tolist(), strict=True)))
        keys = np.array([k for k, _ in pairs], np.uint64)
        spaces = np.array([s for _, s in pairs], np.int64)
        found = table.find(keys, spaces)
        assert len(set(found.tolist())) == len(pairs)
        for pair, slot in zip(pairs, found.tolist(), strict=True):
            if pair in held:
                assert held[pair] == slot
            else:
                assert (table.state[:, slot] == kernels.NOT_CACHED).all()
        # every key of this batch is cached somewhere now; some of the rest go uncached
        for pair, slot in zip(pairs, found.tolist(), strict=True):
            held[pair] = slot
            table.state[int(rng.integers(0, 2)), slot, int(rng.integers(0, 2))] = 0
        for pair in [p for p in held if p not in pairs and rng.random() < 0.3]:
            table.state[:, held.pop(pair)] = kernels.NOT_CACHED
        assert len(set(held.values())) == len(held)
    assert table.slots > 40
    assert table.used >= len(held)
