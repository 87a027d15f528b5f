"""The replay on the real Mooncake FAST'25 conversation trace (../shared, else the bundled copy)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import polars as pl
import pytest

from pipeline.cli import main
from pipeline.schema import conform
from pipeline.sim.blocks import SimInputs, sim_input
from pipeline.sim.config import Scenario
from pipeline.sim.curve import capacity_curve
from pipeline.sim.replay import assign, simulate
from tests.conftest import DEFAULTS, sim_settings, trace_or_missing

TRACE = trace_or_missing("traces", "mooncake-fast25", "conversation_trace.jsonl")
B = 512

pytestmark = pytest.mark.shared


@pytest.fixture(scope="module")
def rows() -> list[dict[str, object]]:
    if not TRACE.exists():
        pytest.skip(f"{TRACE} not present")
    with TRACE.open() as handle:
        return [json.loads(line) for line in handle]


@pytest.fixture(scope="module")
def inp(rows: list[dict[str, object]]) -> SimInputs:
    t0 = datetime(2000, 1, 1, tzinfo=UTC)
    frame = conform(
        pl.DataFrame(
            {
                "request_id": [f"mc:{i}" for i in range(len(rows))],
                "arrival": [t0 + timedelta(milliseconds=int(r["timestamp"])) for r in rows],  # type: ignore[call-overload]
                "prompt_tokens": [r["input_length"] for r in rows],
                "output_tokens": [r["output_length"] for r in rows],
                "block_size": [B] * len(rows),
                # only full blocks: drop the partial last id when input_length % 512 != 0
                "prefix_hashes": [
                    r["hash_ids"][: int(r["input_length"]) // B]  # type: ignore[index,call-overload]
                    for r in rows
                ],
                "prompt_blocks": [int(r["input_length"]) // B for r in rows],  # type: ignore[call-overload]
                "hashes_known": [True] * len(rows),
            },
            schema_overrides={"prefix_hashes": pl.List(pl.UInt64)},
        )
    )
    return sim_input(frame, latency_model=DEFAULTS.shape.latency)


def test_unbounded_single_cache_equals_a_set_walk(
    rows: list[dict[str, object]], inp: SimInputs
) -> None:
    seen: set[int] = set()
    expected = 0
    prompt = 0
    for r in rows:
        n_in = int(r["input_length"])  # type: ignore[call-overload]
        full = r["hash_ids"][: n_in // B]  # type: ignore[index]
        run = 0
        for h in full:
            if h not in seen:
                break
            run += 1
        expected += min(run, max(n_in - 1, 0) // B) * B  # whole blocks, last token recomputed
        prompt += n_in
        seen.update(full)
    got = simulate(inp, Scenario(B, 1, 10**12, "round-robin"), DEFAULTS.simulation).hit_tokens
    assert int(got.sum()) == expected
    assert int(inp.prompt_tokens.sum()) == prompt
    curve = capacity_curve(
        inp, DEFAULTS.simulation, block_size=B, replicas=1, routing="round-robin"
    )
    assert curve.max_hit_tokens == expected


@pytest.mark.parametrize(
    ("replicas", "routing"), [(1, "round-robin"), (4, "round-robin"), (4, "affinity")]
)
def test_curve_equals_direct_on_mooncake(inp: SimInputs, replicas: int, routing: str) -> None:
    curve = capacity_curve(
        inp, DEFAULTS.simulation, block_size=B, replicas=replicas, routing=routing
    )
    a = assign(inp, routing, replicas, DEFAULTS.simulation)
    for cache_tokens in (
        B,
        64 * B,
        1_000_000,
        4_000_000,
        16_000_000,
        curve.saturation_cache_tokens,
    ):
        sc = Scenario(B, replicas, cache_tokens, routing)
        run = simulate(inp, sc, sim_settings(request_lifetime="instant"), assignment=a)
        assert curve.hit_tokens_at(cache_tokens) == int(run.hit_tokens.sum())


def test_affinity_on_inferred_sessions_beats_round_robin(inp: SimInputs) -> None:
    assert inp.sessions_inferred > 0
    rr = simulate(
        inp, Scenario(B, 4, 4_000_000, "round-robin"), DEFAULTS.simulation
    ).hit_tokens.sum()
    aff = simulate(inp, Scenario(B, 4, 4_000_000, "affinity"), DEFAULTS.simulation).hit_tokens.sum()
    assert aff > rr


def test_cli_on_the_raw_trace_agrees_with_the_direct_frame(
    inp: SimInputs, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "simulate",
            str(TRACE),
            "--block-size",
            "512",
            "--replicas",
            "4",
            "--routing",
            "round-robin",
            "--cache-tokens",
            "1000000",
            "--json",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    direct = simulate(inp, Scenario(B, 4, 1_000_000, "round-robin"), DEFAULTS.simulation)
    assert out["prompt_tokens"] == int(inp.prompt_tokens.sum())
    assert out["hit_tokens"] == int(direct.hit_tokens.sum())
    assert len(out["per_replica"]) == 4
