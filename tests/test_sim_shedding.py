"""An overloaded replica sheds the requests it would stretch past ``simulation.request_timeout_s``
(durations lifetime): worked by hand on one replica with one slot, counted in the summary and
the scenario table, the same over the flattened and the streamed replays, and bounding the
requests a replica holds running however far the arrivals outrun it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from perf.workload import canonical_frame, conversations, spec
from pipeline.config import config_from_mapping
from pipeline.errors import ConfigError
from pipeline.layout import WorkloadLayout
from pipeline.sim import stage
from pipeline.sim.blocks import sim_input
from pipeline.sim.config import Scenario
from pipeline.sim.replay import simulate, summarise
from pipeline.sim.result import SCENARIO_SCHEMA, ScenarioSummary, scenario_frame
from pipeline.sim.stream import frame_chunks, simulate_streamed
from pipeline.store import publish_ingest
from tests.conftest import DEFAULTS, sim_settings
from tests.test_sim_lifetimes import B, canonical

LATENCY = DEFAULTS.simulation.latency(DEFAULTS.shape.latency)

# One replica, one slot, a 1.5 s timeout. A request admitted with n in flight (itself
# included) past the slot takes e2e × n; it is shed when that exceeds 1.5 s.
# r0   0 ms [1, 2]    1000 ms: alone (n = 1)                    → runs to 1000
# r1 100 ms [1, 2]    1000 ms: n = 2, 2000 ms > 1500            → shed
# r2 200 ms [1, 2, 3]  500 ms: n = 2 (r1 took no slot), 1000 ms → runs to 1200, hits r0's
#                               pinned 1, 2 (limit ⌊12/4⌋ = 3): 8 tokens
# r3 300 ms [1, 2]     500 ms: n = 3, 1500 ms, not above        → runs to 1800, hits 8
# r4 400 ms [1, 2]     400 ms: n = 4, 1600 ms > 1500            → shed
# r5 2 s    [1, 2]    5000 ms: every other done (n = 1): its own duration past the timeout
#                               sheds nothing                    → hits the cached 1, 2: 8
OVERLOAD = [
    {"t_ms": 0, "hashes": [1, 2], "e2e_ms": 1000.0},
    {"t_ms": 100, "hashes": [1, 2], "e2e_ms": 1000.0},
    {"t_ms": 200, "hashes": [1, 2, 3], "e2e_ms": 500.0},
    {"t_ms": 300, "hashes": [1, 2], "e2e_ms": 500.0},
    {"t_ms": 400, "hashes": [1, 2], "e2e_ms": 400.0},
    {"t_ms": 2000, "hashes": [1, 2], "e2e_ms": 5000.0},
]
ONE_SLOT = {"replica_slots": 1, "request_timeout_s": 1.5}


def test_one_slot_sheds_what_it_would_finish_past_the_timeout() -> None:
    inp = sim_input(canonical(OVERLOAD), latency_model=DEFAULTS.shape.latency)
    sc = Scenario(B, 1, 1000, "round-robin")
    run = simulate(inp, sc, sim_settings(**ONE_SLOT))
    assert run.shed.tolist() == [False, True, False, False, True, False]
    assert run.hit_tokens.tolist() == [0, 0, 8, 8, 0, 8]
    # r0, r2, r3 pinned together: 1, 2, 3
    assert run.peak_pinned_blocks.tolist() == [3]
    # nothing pinned, nothing shed: r1 hits the cached 1, 2 as well
    assert run.hit_tokens_instant is not None
    assert run.hit_tokens_instant.tolist() == [0, 8, 8, 8, 8, 8]
    # without the timeout the stretch keeps everything: r1 runs to 2100, r2 (n = 3) to 1700,
    # r3 (n = 4) to 2300, r4 (n = 5) to 2400, and each hits the pinned 1, 2
    kept = simulate(inp, sc, sim_settings(replica_slots=1, request_timeout_s=None))
    assert not kept.shed.any() and kept.hit_tokens.tolist() == [0, 8, 8, 8, 8, 8]
    # nor does the instant lifetime shed: it has no durations
    instant = simulate(inp, sc, sim_settings(**ONE_SLOT, request_lifetime="instant"))
    assert not instant.shed.any() and instant.hit_tokens.tolist() == [0, 8, 8, 8, 8, 8]


def test_the_summary_and_the_table_count_the_shed_requests() -> None:
    inp = sim_input(canonical(OVERLOAD), latency_model=DEFAULTS.shape.latency)
    sc = Scenario(B, 1, 1000, "round-robin")
    out = summarise(inp, simulate(inp, sc, sim_settings(**ONE_SLOT)))
    assert (out["requests"], out["shed_requests"]) == (6, 2)
    # the served and the shed make up the replica's requests; the shed hit nothing
    assert out["per_replica"][0]["requests"] == 6
    assert out["hit_tokens"] == 24
    assert out["warnings"][0] == (
        "1 replica(s) cannot carry this traffic: 2 of 6 requests shed, each one its overloaded "
        "replica would have finished more than 1.5 s after it arrived "
        "(simulation.request_timeout_s); their prompt tokens count as not cached"
    )
    shed = ScenarioSummary.from_json(out)
    assert shed.to_json()["shed_requests"] == 2
    # a replay that kept up writes what it always wrote: no key, no column
    kept = ScenarioSummary.from_json(summarise(inp, simulate(inp, sc, DEFAULTS.simulation)))
    assert kept.shed_requests == 0 and "shed_requests" not in kept.to_json()
    assert scenario_frame([kept]).schema == SCENARIO_SCHEMA
    table = scenario_frame([kept, shed.model_copy(update={"scenario": "z"})])
    assert table.columns[table.columns.index("requests") + 1] == "shed_requests"
    assert table["shed_requests"].to_list() == [0, 2]


def _overloaded(n: int = 3000) -> pl.DataFrame:
    # 5 requests a second of about 4 s each: far more than a replica of one or two slots carries
    return canonical_frame(conversations(spec(n, "short", rate_rps=5.0, seed=4)), 16)


@pytest.mark.parametrize(
    ("routing", "replicas"),
    [("round-robin", 1), ("least-loaded", 4), ("cache-aware", 4), ("affinity", 4)],
)
def test_the_streamed_replay_sheds_what_the_flattened_one_sheds(
    routing: str, replicas: int
) -> None:
    frame = _overloaded(1200)
    inp = sim_input(frame, latency_model=LATENCY)
    settings = sim_settings(replica_slots=1, request_timeout_s=4.0)
    scenario = Scenario(16, replicas, 16 * 80, routing)
    one_pass = summarise(inp, simulate(inp, scenario, settings))
    assert 0 < one_pass["shed_requests"] < one_pass["requests"]
    streamed = simulate_streamed(
        frame_chunks(frame, 97), scenario, settings, latency_model=LATENCY
    ).summary
    assert streamed == one_pass


def test_the_timeout_bounds_the_requests_running_on_an_overloaded_replica() -> None:
    """At most the slots' requests plus those that arrived within the timeout run at once;
    without it a replica that cannot keep up holds ever more."""
    frame = _overloaded()
    inp = sim_input(frame, latency_model=LATENCY)
    slots, timeout = 2, 10.0
    arrival = inp.arrival_us
    window = np.searchsorted(arrival, arrival + round(timeout * 1e6), side="right")
    bound = slots + int((window - np.arange(arrival.size)).max())
    scenario = Scenario(16, 1, 16 * 80, "round-robin")

    def peak(timeout_s: float | None) -> int:
        settings = sim_settings(replica_slots=slots, request_timeout_s=timeout_s)
        run = simulate_streamed(
            frame_chunks(frame, 100), scenario, settings, latency_model=LATENCY, with_instant=False
        )
        return run.peak_running

    assert peak(timeout) <= bound < peak(None)


def test_the_timeout_is_a_documented_bounded_key() -> None:
    assert DEFAULTS.simulation.request_timeout_s == 600
    cfg = config_from_mapping({"simulation": {"request_timeout_s": None}}).simulation
    assert cfg.request_timeout_s is None and cfg.timeout_us("durations") == 0
    assert DEFAULTS.simulation.timeout_us("durations") == 600_000_000
    assert DEFAULTS.simulation.timeout_us("instant") == 0
    for value in (0, -1, 1e12, "long"):
        with pytest.raises(ConfigError, match=r"simulation\.request_timeout_s"):
            config_from_mapping({"simulation": {"request_timeout_s": value}})


def test_the_configured_command_prints_which_scenarios_shed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The scenario table has a count; the command also says what it means, naming the
    scenarios, as the document does: one replica of eight slots sheds, four replicas do not."""
    from pipeline.cli import main

    layout = WorkloadLayout(tmp_path / "data" / "overloaded")
    publish_ingest(layout, [_overloaded(600)])
    config = tmp_path / "enginefit.yaml"
    config.write_text(
        "workload: {name: overloaded, traces: [unused.jsonl], hash_salt: s}\n"
        f"paths: {{data_dir: {tmp_path / 'data'}, reports_dir: {tmp_path / 'reports'}}}\n"
        "simulation: {block_sizes: [16], replicas: [1, 4], routings: [round-robin], "
        "cache_tokens: [1280], replica_slots: 8, request_timeout_s: 10}\n"
    )
    assert main(["simulate", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    written = {s.scenario: s for s in stage.read_summaries(layout)}
    shed = [name for name, s in written.items() if s.shed_requests]
    assert shed and len(shed) < len(written)  # one replica sheds, four keep up
    lines = [line for line in out.splitlines() if "cannot carry this traffic" in line]
    assert len(lines) == len(shed)
    for name, line in zip(shed, lines, strict=True):
        count = written[name].shed_requests
        assert line.startswith(f"warning ({name}): 1 replica(s) cannot carry this traffic: ")
        assert f"{count:,} of 600 requests shed" in line
