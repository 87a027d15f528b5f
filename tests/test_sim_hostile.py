"""Hostile input to the simulation: every number a user gives ``simulate`` and ``curve`` is
validated (one line naming the flag, exit 2) before the trace is read or a kernel runs, the
configured grid meets the same bounds, and the kernels refuse sizes that would take them
outside their arrays."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pipeline.cli import main
from pipeline.config import config_from_mapping
from pipeline.errors import ConfigError
from pipeline.sim import curve_kernels, kernels
from pipeline.sim.blocks import SimulationInputError, sim_input
from pipeline.sim.config import MAX_REPLICAS, Scenario
from pipeline.sim.kernels import KernelArgumentError
from pipeline.sim.replay import simulate
from tests.conftest import DEFAULTS, write_requests
from tests.workloads import growing_conversations

# Validation must come first: a trace that does not exist is never reached.
NO_TRACE = "no-such-trace.parquet"


def _frame(n: int = 12) -> pl.DataFrame:
    """Three conversations growing one 16-token block per turn."""
    return growing_conversations(n, 3, extra_tokens=1, output_tokens=4)


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    write_requests(_frame(), tmp_path / "wl")
    return tmp_path / "wl"


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The command's one error line (it must fail with exit 2 and print nothing else after
    the configuration line)."""
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith(f"enginefit {argv[0]}: configuration:")
    return err[1]


WITH_CACHE_TOKENS = ["simulate", NO_TRACE, "--block-size", "16", "--cache-tokens"]
WITH_BLOCK_SIZE = ["simulate", NO_TRACE, "--cache-tokens", "1", "--block-size"]
SIMULATE = [*WITH_CACHE_TOKENS, "100"]
CURVE = ["curve", NO_TRACE, "--block-size", "16"]


@pytest.mark.parametrize(
    ("argv", "flag", "reason"),
    [
        # negative capacities once reached the kernel and crashed it
        (
            [*WITH_CACHE_TOKENS, "-5"],
            "--cache-tokens",
            "greater than or equal to 0 (got '-5')",
        ),
        (
            [*WITH_CACHE_TOKENS, "-1"],
            "--cache-tokens",
            "greater than or equal to 0 (got '-1')",
        ),
        (
            [*WITH_CACHE_TOKENS, "1e400"],
            "--cache-tokens",
            "valid integer",
        ),
        (
            [*WITH_CACHE_TOKENS, str(10**16)],
            "--cache-tokens",
            "at most 1,000,000,000,000,000 cache tokens per replica",
        ),
        ([*SIMULATE, "--replicas", "0"], "--replicas", "greater than 0 (got '0')"),
        ([*SIMULATE, "--replicas", "-3"], "--replicas", "greater than 0 (got '-3')"),
        (
            [*SIMULATE, "--replicas", "100000000"],
            "--replicas",
            f"at most {MAX_REPLICAS:,} replicas (per-replica outputs and routing work grow",
        ),
        ([*SIMULATE, "--replicas", "2.5"], "--replicas", "valid integer"),
        (
            [*WITH_BLOCK_SIZE, "0"],
            "--block-size",
            "a block size is 1 to 4096 tokens",
        ),
        (
            [*WITH_BLOCK_SIZE, "-16"],
            "--block-size",
            "a block size is 1 to 4096 tokens",
        ),
        (
            [*WITH_BLOCK_SIZE, str(2**40)],
            "--block-size",
            "a block size is 1 to 4096 tokens",
        ),
        ([*SIMULATE, "--seed", "-5"], "--seed", "greater than or equal to 0 (got '-5')"),
        (
            [*SIMULATE, "--seed", "nan"],
            "--seed",
            "unable to parse string as an integer (got 'nan')",
        ),
        ([*SIMULATE, "--margin", "nan"], "--margin", "finite number (got 'nan')"),
        ([*SIMULATE, "--margin=-inf"], "--margin", "finite number (got '-inf')"),
        ([*SIMULATE, "--margin", "-0.5"], "--margin", "greater than or equal to 0"),
        ([*SIMULATE, "--routing", "sticky"], "--routing", "Input should be 'round-robin'"),
        (
            [*SIMULATE, "--request-lifetime", "forever"],
            "--request-lifetime",
            "Input should be 'durations' or 'instant' (got 'forever')",
        ),
        ([*CURVE, "--points", "1"], "--points", "greater than or equal to 2 (got '1')"),
        ([*CURVE, "--points", "-4"], "--points", "greater than or equal to 2"),
        ([*CURVE, "--points", "1000000000"], "--points", "less than or equal to 10000"),
        ([*CURVE, "--points", "nan"], "--points", "valid integer"),
        ([*CURVE, "--sample-rate", "nan"], "--sample-rate", "finite number (got 'nan')"),
        ([*CURVE, "--sample-rate", "0"], "--sample-rate", "greater than or equal to 1e-06"),
        ([*CURVE, "--sample-rate", "1e-300"], "--sample-rate", "greater than or equal to 1e-06"),
        ([*CURVE, "--sample-rate", "1.5"], "--sample-rate", "less than or equal to 1"),
        ([*CURVE, "--replicas", "-1"], "--replicas", "greater than 0"),
        ([*CURVE, "--seed", "-1"], "--seed", "greater than or equal to 0"),
        ([*CURVE, "--margin", "inf"], "--margin", "finite number"),
    ],
)
def test_every_number_is_validated_before_the_trace_is_read(
    argv: list[str], flag: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _error(argv, capsys)
    assert line.startswith(f"enginefit: error: {flag}: "), line
    assert reason in line.replace("0.000001", "1e-06"), line
    assert NO_TRACE not in line


def test_negative_cache_tokens_never_reach_the_kernel_on_a_real_trace(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", str(trace), "--block-size", "16", "--cache-tokens", "-5"]
    assert _error(argv, capsys) == (
        "enginefit: error: --cache-tokens: Input should be greater than or equal to 0 (got '-5')"
    )
    # the same scenario at 0 tokens is valid and hits nothing (no block can be kept)
    assert (
        main(["simulate", str(trace), "--block-size", "16", "--cache-tokens", "0", "--json"]) == 0
    )
    assert '"hit_tokens": 0' in capsys.readouterr().out


def test_curve_refuses_a_routing_that_reads_cache_state_in_one_line(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = (
        "enginefit: error: routing 'cache-aware' reads cache state, so no single-pass curve "
        "exists; simulate each capacity instead"
    )
    for path in (NO_TRACE, str(trace)):  # refused before the trace is read
        argv = ["curve", path, "--block-size", "16", "--replicas", "2", "--routing", "cache-aware"]
        assert _error(argv, capsys) == expected
    # with one replica the routing decides nothing: the single-replica curve
    assert main(["curve", str(trace), "--block-size", "16", "--routing", "cache-aware"]) == 0
    assert "1 replica(s), single" in capsys.readouterr().out


def test_the_configured_grid_meets_the_same_bounds() -> None:
    for raw, message in (
        ({"replicas": [1, 100_000_000]}, "simulation.replicas[1]: at most 4,096 replicas"),
        ({"replicas": [0]}, "simulation.replicas[0]: Input should be greater than 0"),
        ({"cache_tokens": [-5]}, "simulation.cache_tokens[0]: Input should be greater than or"),
        ({"cache_tokens": [10**16]}, "simulation.cache_tokens[0]: at most 1,000,000,000,000,000"),
        ({"block_sizes": [8192]}, "simulation.block_sizes[0]: a block size is 1 to 4096 tokens"),
        ({"replica_slots": 2**40}, "simulation.replica_slots: Input should be less than or"),
        (
            {"cache_aware": {"preset": "library", "balance_abs_threshold": 2**40}},
            "simulation.cache_aware: balance_abs_threshold: Input should be less than or equal",
        ),
    ):
        with pytest.raises(ConfigError) as caught:
            config_from_mapping({"simulation": raw})
        assert message in str(caught.value), str(caught.value)
    # the bound itself is allowed
    grid = config_from_mapping({"simulation": {"replicas": [MAX_REPLICAS]}}).simulation
    assert grid.replicas == (MAX_REPLICAS,)


def test_simulate_refuses_a_scenario_the_grid_would_refuse() -> None:
    inp = sim_input(_frame(), latency_model=DEFAULTS.shape.latency)
    for scenario in (
        Scenario(16, 1, -5, "round-robin"),
        Scenario(16, 0, 100, "round-robin"),
        Scenario(16, MAX_REPLICAS + 1, 100, "affinity"),
    ):
        with pytest.raises(SimulationInputError, match=r"replicas must lie in 1\.\.4096"):
            simulate(inp, scenario, DEFAULTS.simulation)


# --- the kernels' own guards -----------------------------------------------------------------


def _replay_args(**changes: object) -> dict[str, object]:
    """A valid two-request replay (chains [0, 1] and [0, 2]) with ``changes`` applied."""
    args: dict[str, object] = {
        "offsets": np.array([0, 2, 4], np.int64),
        "ids": np.array([0, 1, 0, 2], np.int64),
        "prompt_blocks": np.array([2, 2], np.int64),
        "missing": np.array([0, 1], np.int64),
        "hit_limit": np.array([1, 1], np.int64),
        "prompt_tokens": np.array([33, 33], np.int64),
        "block_size": 16,
        "n_ids": 3,
        "arrival": np.array([0, 5], np.int64),
        "base_duration": np.array([1, 1], np.int64),
        "order": np.array([0, 1], np.int64),
        "starts": np.array([0, 2], np.int64),
        "routing": kernels.FIXED,
        "replicas": 1,
        "capacity": 8,
        "queue_size": 16,
        "instant": True,
        "replica_slots": 0,
        "timeout": 0,
        "cache_threshold": 0.5,
        "balance_abs": 32,
        "balance_rel": 1.1,
    }
    return {**args, **changes}


def test_the_replay_kernel_runs_on_valid_input() -> None:
    hits, chosen, balance, peak, shed = kernels.replay(**_replay_args())  # type: ignore[arg-type]
    # request 1 finds block 0 cached: one 16-token block, within its hit limit of 1
    assert hits.tolist() == [0, 16] and chosen.tolist() == [0, 0] and balance == 0
    assert peak.tolist() == [0] and shed.tolist() == [False, False]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"capacity": -1}, "capacity must lie in 0..4,611,686,018,427,387,904 blocks, got -1"),
        ({"block_size": 0}, "block_size must lie in 1..2,147,483,647, got 0"),
        ({"queue_size": 0}, "queue_size must lie in 1..2,147,483,647, got 0"),
        ({"queue_size": 2**40}, "queue_size must lie in 1..2,147,483,647, got 1099511627776"),
        ({"replicas": 0}, "replicas must be ≥ 1, got 0"),
        ({"replica_slots": -1}, "replica_slots must lie in 0..2,147,483,647, got -1"),
        ({"routing": 7}, "unknown routing 7"),
        # a router in the loop holds every replica's state: 2^20 rows × 2^11 int32 = 8 GiB
        (
            {"routing": kernels.CACHE_AWARE, "replicas": 2**20, "queue_size": 2**11 - 3},
            "8.0 GiB of block state is above MAX_STATE_BYTES",
        ),
        ({"n_ids": 2}, "block ids must lie in 0..1"),
        ({"n_ids": 0}, "n_ids must lie in 1..2^31-1, got 0"),
        ({"ids": np.array([0, 1, 0, -2], np.int64)}, "block ids must lie in 0..2"),
        ({"offsets": np.array([0, 2, 5], np.int64)}, "offsets must rise from 0 to the 4"),
        ({"offsets": np.array([0, 3, 2, 4], np.int64)}, "offsets must rise from 0 to the 4"),
        ({"missing": np.array([0, -1], np.int64)}, "missing block counts must be ≥ 0"),
        ({"hit_limit": np.array([3, 0], np.int64)}, "hit_limit must lie between 0 and"),
        ({"prompt_blocks": np.array([2, 5], np.int64)}, "prompt_blocks must lie between 0"),
        ({"arrival": np.array([0], np.int64)}, "arrival needs one value per request (2), has 1"),
        ({"order": np.array([0, 2], np.int64)}, "order must hold request indices 0..1"),
        ({"starts": np.array([0, 3], np.int64)}, "starts must rise within the 2 entries"),
        # FIXED replays one stream per replica: a third stream has no replica row
        ({"starts": np.array([0, 1, 2], np.int64)}, "starts needs 2..2 entries, has 3"),
    ],
)
def test_the_replay_kernel_refuses_what_would_leave_its_arrays(
    changes: dict[str, object], message: str
) -> None:
    with pytest.raises(KernelArgumentError) as caught:
        kernels.replay(**_replay_args(**changes))  # type: ignore[arg-type]
    assert str(caught.value).startswith("replay kernel: ") and message in str(caught.value)


def test_the_routing_kernels_refuse_bad_replica_counts_and_indices() -> None:
    tokens = np.array([5, 6, 7], np.int64)
    assert kernels.least_served(tokens, 2).tolist() == [0, 1, 0]
    with pytest.raises(KernelArgumentError, match="least_served kernel: replicas must be ≥ 1"):
        kernels.least_served(tokens, 0)
    home = np.array([0, 0, 0, 0], np.int64)
    replica, spills = kernels.bounded_affinity(home, 2, 0.0)
    # bound ceil((i + 1) / 2): requests 1 and 3 spill to replica 1
    assert replica.tolist() == [0, 1, 0, 1] and spills == 2
    with pytest.raises(KernelArgumentError, match=r"replica indices must lie in 0\.\.1"):
        kernels.bounded_affinity(np.array([0, 2], np.int64), 2, 0.0)
    with pytest.raises(KernelArgumentError, match="margin nan"):
        kernels.bounded_affinity(home, 2, float("nan"))
    with pytest.raises(KernelArgumentError, match=r"replica indices must lie in 0\.\.2"):
        kernels.group_by_replica(np.array([0, 3], np.int64), 3)
    with pytest.raises(KernelArgumentError, match="is_chained kernel: block ids must lie"):
        kernels.is_chained(np.array([0, 2], np.int64), np.array([0, 5], np.int64), 3)
    with pytest.raises(KernelArgumentError, match="offsets must rise within the 3 bytes"):
        kernels.fnv1a_strings(np.array([0, 4], np.int64), np.zeros(3, np.uint8))


def test_the_curve_kernels_refuse_what_would_leave_their_arrays() -> None:
    a = _replay_args()
    chains = (a["offsets"], a["ids"], a["missing"], a["hit_limit"], 16, 3)
    order, starts = np.array([0, 1], np.int64), np.array([0, 2], np.int64)
    caps, hit_tokens = curve_kernels.hit_steps_chained(*chains, order, starts, 7)  # type: ignore[arg-type]
    # request 0 refreshes its chain tail first, so block 0 is on top of the stack (depth 1)
    # when request 1 looks it up: 16 tokens at every capacity of one block or more
    assert caps.tolist() == [1] and hit_tokens.tolist() == [16]
    bad = (a["offsets"], a["ids"], a["missing"], np.array([3, 0], np.int64), 16, 3)
    with pytest.raises(KernelArgumentError, match="hit_steps_chained kernel: hit_limit"):
        curve_kernels.hit_steps_chained(*bad, order, starts, 7)  # type: ignore[arg-type]
    with pytest.raises(KernelArgumentError, match=r"hist_size must lie in 1\.\.7, got 100"):
        curve_kernels.hit_steps_chained(*chains, order, starts, 100)  # type: ignore[arg-type]
    with pytest.raises(KernelArgumentError, match="stack_depth_histogram kernel: order"):
        curve_kernels.stack_depth_histogram(
            *chains,  # type: ignore[arg-type]
            np.array([0, 9], np.int64),
            starts,
            np.uint64(2**63),
            np.uint64(0),
            8,
        )


# --- durations: the other numbers that reach the replay kernel -------------------------------


def test_durations_that_would_overflow_the_kernel_are_refused() -> None:
    frame = _frame().with_columns(
        pl.when(pl.col("request_id") == "r4")
        .then(pl.lit(float("nan")))
        .otherwise(100.0)
        .alias("e2e_ms")
    )
    with pytest.raises(SimulationInputError) as caught:
        sim_input(frame, latency_model=DEFAULTS.shape.latency)
    assert str(caught.value) == (
        "duration of request 'r4' (row 4 in arrival order) is nan ms (logged e2e_ms, else the "
        "latency model): not a finite duration below 2^61 µs"
    )
    # a latency model whose estimate overflows int64 microseconds (the configuration bounds
    # its own, but a model may come from elsewhere) is refused the same way, naming the first
    # request
    huge = dataclasses.replace(DEFAULTS.shape.latency, tpot_ms=1e300)
    with pytest.raises(SimulationInputError, match=r"duration of request 'r0' \(row 0"):
        sim_input(_frame(), latency_model=huge)


def test_a_stretched_duration_saturates_instead_of_overflowing() -> None:
    # five requests on one replica with one slot, each on chain [0] plus one anonymous block and
    # a 2^61 µs base duration: the fourth is admitted with 4 in flight, 4 × 2^61 overflows int64
    # (it would finish before it started and be released at the next arrival); it saturates
    # instead, so all five stay pinned: block 0 and five anonymous blocks
    n = 5
    one = np.ones(n, np.int64)
    args = _replay_args(
        offsets=np.arange(n + 1, dtype=np.int64),
        ids=np.zeros(n, np.int64),
        prompt_blocks=one,
        missing=one,
        hit_limit=one,
        prompt_tokens=one * 17,
        n_ids=1,
        arrival=np.arange(n, dtype=np.int64),
        base_duration=one * 2**61,
        order=np.arange(n, dtype=np.int64),
        starts=np.array([0, n], np.int64),
        instant=False,
        replica_slots=1,
    )
    hits, _, _, peak, _ = kernels.replay(**args)  # type: ignore[arg-type]
    assert hits.tolist() == [0, 16, 16, 16, 16]
    assert peak.tolist() == [1 + n]
    with pytest.raises(KernelArgumentError, match=r"durations must lie in 0\.\.2\^61 µs"):
        kernels.replay(**_replay_args(base_duration=np.array([-1, 1], np.int64)))  # type: ignore[arg-type]
