"""The scenarios' streamed pass kept at the end of the last day and resumed on the days after
(pipeline.sim.resume): the pass pickled between any two chunks and fed the rest gives the
summaries of one pass; a day appended to a union of days replays that day alone and writes
what a replay of every day writes; a day it covers ingested again, other settings or a damaged
file replay the whole table, each saying why."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from pipeline.bench import stage as bench_stage
from pipeline.capacity import stage as capacity_stage
from pipeline.capacity.fleet_cache import CacheReplays
from pipeline.cli import main as enginefit
from pipeline.config import Config, load_config
from pipeline.ingest import days
from pipeline.ingest.days import UnitedDay
from pipeline.layout import WorkloadLayout
from pipeline.resume import MARKER, STATE, KeptPass
from pipeline.sim import stage
from pipeline.sim.blocks import SimulationInputError
from pipeline.sim.compute import curve_points
from pipeline.sim.config import Scenario
from pipeline.sim.curve_stream import stored_blocks
from pipeline.sim.result import ScenarioSummary, curves_frame
from pipeline.sim.resume import DailyStream
from pipeline.sim.stream import (
    RequestChunks,
    StreamPass,
    TableFacts,
    _settled_facts,
    part_chunks,
    routes_by_session,
    simulate_many,
)
from tests.conftest import sim_settings
from tests.test_daily_partitions import DAYS, _config, _run_day, three_days
from tests.test_sim_stream import LATENCY, _parts, _workload

__all__ = ["three_days"]  # a fixture

# Every kind of state a pass carries: the random generator, the routers' counters, the
# sessions inferred (half the ids missing), requests running across the cut (durations, 4
# slots), the cache-aware router's load, isolation's namespaces, both lifetimes' tables.
SCENARIOS = [
    Scenario(16, 1, 16 * 80, "round-robin", True),
    Scenario(16, 4, 16 * 60, "random"),
    Scenario(16, 4, 16 * 60, "bounded-affinity"),
    Scenario(16, 4, 16 * 60, "cache-aware"),
    Scenario(32, 4, 32 * 40, "least-served", True),
    Scenario(32, 2, 32 * 40, "least-loaded"),
]


def _chunks(parts: RequestChunks, first: int, last: int | None = None) -> RequestChunks:
    return lambda: list(parts())[first:last]


@pytest.mark.parametrize("cut", [1, 3, 5])
def test_a_pass_kept_between_chunks_and_fed_the_rest_is_one_pass(tmp_path: Path, cut: int) -> None:
    parts = _parts(_workload("half"), tmp_path, 6)
    settings = sim_settings(request_lifetime="durations", replica_slots=4)
    one_pass = simulate_many(parts, SCENARIOS, settings, latency_model=LATENCY, max_rows=97)
    facts = TableFacts.of(parts, any(routes_by_session(s.routing) for s in SCENARIOS))
    assert facts.infer_sessions
    first = StreamPass(SCENARIOS, settings, facts, latency_model=LATENCY, max_rows=97)
    first.feed(_chunks(parts, 0, cut))
    assert any(r.n_running for run in first.runs for r in run.replays)  # carried across
    # kept and read back as the stage does (pickled, zstd-compressed, its digest checked)
    kept = KeptPass(tmp_path / "kept", None)
    days = (UnitedDay("first", "a", cut),)
    kept.keep(first, "key", days, {})
    del first
    back, why = kept.read_back("key", (*days, UnitedDay("then", "b", 6 - cut)), StreamPass, {})
    assert back is not None, why
    resumed, covered = back
    assert covered == 1
    resumed.feed(_chunks(parts, cut))
    runs = resumed.finish()
    for a, b in zip(one_pass, runs, strict=True):
        assert json.dumps(b.summary, sort_keys=True) == json.dumps(a.summary, sort_keys=True)
        assert (b.chunks, b.peak_running, b.distinct_blocks) == (
            a.chunks,
            a.peak_running,
            a.distinct_blocks,
        )
    assert sum(s["sessions_inferred"] for s in (r.summary for r in runs)) > 0


# ---------------------------------------------------------------------------------------------
# A union of days, streamed by the stage


def _streamed_config(tmp_path: Path, traces: Path) -> Config:
    """The daily configuration with every scenario streamed (a 1-block flattening limit)."""
    config = load_config(_config(tmp_path, "daily", [str(traces / "mooncake-{day}.jsonl")]))
    settings = config.simulation.replace(curve_exact_max_blocks=1, request_timeout_s=600.0)
    return dataclasses.replace(config, simulation=settings)


def _unite(config: Config, upto: int) -> WorkloadLayout:
    layout = config.layout()
    for day in DAYS[:upto]:
        if not layout.day(day).ingest.manifest.is_file():
            days.write_day(_run_day(config, day), layout, day)
    days.write_union(layout, list(DAYS[:upto]))
    return layout


def _replayed(config: Config) -> tuple[list[dict[str, Any]], str | None]:
    """The scenarios as the stage replays them, and what it said of the kept pass."""
    layout, settings = config.layout(), config.simulation
    inputs = stage.scenario_inputs(layout, settings, settings.latency(config.shape.latency))
    assert isinstance(inputs, DailyStream)
    summaries = stage.replay(inputs, settings.scenarios(), settings)
    return [s.to_json() for s in summaries], stage.resume_note(inputs)


def _from_scratch(config: Config) -> list[dict[str, Any]]:
    """Every day replayed, nothing kept read (the kept pass moved aside meanwhile)."""
    folder = config.layout().scenario_passes
    aside = folder.with_name("resume-aside")
    folder.rename(aside)
    try:
        summaries, note = _replayed(config)
        assert note is not None and "no pass kept yet" in note
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        aside.rename(folder)
    return summaries


def test_a_day_appended_replays_that_day_alone(three_days: Path, tmp_path: Path) -> None:
    config = _streamed_config(tmp_path, three_days)
    _unite(config, 2)
    first, note = _replayed(config)
    assert note is not None and note.startswith("scenario replay: 2 day(s) replayed (no pass kept")
    assert "the pass at the end of 2025-02-22 kept in" in note
    folder = config.layout().scenario_passes / "scenarios"
    kept = json.loads((folder / MARKER).read_text())
    assert [d["day"] for d in kept["days"]] == list(DAYS[:2]) and kept["requests"] > 0

    _unite(config, 3)
    appended, note = _replayed(config)
    assert note is not None
    assert note.startswith("scenario replay: 1 day(s) replayed (2 of 3 days read back)")
    assert appended == _from_scratch(config)
    assert appended != first  # the third day is in it
    sums = [ScenarioSummary.from_json(s).requests for s in appended]
    assert sums == [ScenarioSummary.from_json(s).requests + 1500 for s in first]

    state = (folder / STATE).stat()
    again, note = _replayed(config)  # nothing new: every day read back, nothing rewritten
    assert note is not None and "0 day(s) replayed (3 of 3 days read back)" in note
    assert note.endswith(f"the pass at the end of {DAYS[2]} unchanged in {folder}")
    assert again == appended
    assert (folder / STATE).stat().st_mtime_ns == state.st_mtime_ns


def test_what_the_kept_pass_does_not_cover_is_replayed_whole_and_said(
    three_days: Path, tmp_path: Path
) -> None:
    config = _streamed_config(tmp_path, three_days)
    _unite(config, 3)
    whole, _ = _replayed(config)
    folder = config.layout().scenario_passes / "scenarios"

    # other settings: a cache size of the grid changed
    other = dataclasses.replace(
        config, simulation=config.simulation.replace(cache_tokens=(4096, 65536))
    )
    _, note = _replayed(other)
    assert note is not None and "made with other settings or code" in note
    others = (folder / STATE).read_bytes()
    _replayed(config)  # kept again with the configured grid

    # the state of another run renamed in under this marker (its digest made to match)
    (folder / STATE).write_bytes(others)
    marker = json.loads((folder / MARKER).read_text())
    marker["state_sha256"] = hashlib.sha256(others).hexdigest()
    (folder / MARKER).write_text(json.dumps(marker))
    replayed, note = _replayed(config)
    assert note is not None and f"{folder / STATE} is not the pass {folder / MARKER} names" in note
    assert replayed == whole

    # a pass that cannot be kept (a full disk): the replay's results stand, and it is said
    def full(*args: object) -> int:
        raise OSError("No space left on device")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(KeptPass, "keep", full)
        (folder / MARKER).unlink()
        replayed, note = _replayed(config)
    assert note is not None and "the pass was not kept (No space left on device)" in note
    assert replayed == whole
    _replayed(config)

    # a damaged state: its digest no longer matches the marker
    with (folder / STATE).open("r+b") as handle:
        handle.seek(100)
        handle.write(b"\x00\x01\x02")
    replayed, note = _replayed(config)
    assert note is not None and f"{folder / STATE} does not match" in note
    assert replayed == whole

    # a state its marker names that is not a kept pass (its digest matching)
    (folder / STATE).write_bytes(b"not a pass")
    marker = json.loads((folder / MARKER).read_text())
    marker["state_sha256"] = hashlib.sha256(b"not a pass").hexdigest()
    (folder / MARKER).write_text(json.dumps(marker))
    replayed, note = _replayed(config)
    assert note is not None and f"{folder / STATE} cannot be read back" in note
    assert replayed == whole

    # a day it covers ingested again (one record fewer): that day is named, all replayed
    trace = three_days / f"mooncake-{DAYS[0]}.jsonl"
    trace.write_text("".join(trace.read_text().splitlines(keepends=True)[:-1]))
    layout = config.layout()
    days.write_day(_run_day(config, DAYS[0]), layout, DAYS[0])
    days.write_union(layout, list(DAYS))
    changed, note = _replayed(config)
    assert note is not None and f"day {DAYS[0]}, which the kept pass covers, changed" in note
    assert note.startswith("scenario replay: 3 day(s) replayed")
    assert [ScenarioSummary.from_json(s).requests for s in changed] == [
        ScenarioSummary.from_json(s).requests - 1 for s in whole
    ]


def test_a_union_written_before_its_days_parts_were_recorded_is_streamed_whole(
    three_days: Path, tmp_path: Path
) -> None:
    config = _streamed_config(tmp_path, three_days)
    layout = _unite(config, 3)
    assert [d.parts for d in days.united_days(layout) or []] == [1, 1, 1]
    manifest = json.loads(layout.ingest.manifest.read_text())
    del manifest["day_parts"]
    layout.ingest.manifest.write_text(json.dumps(manifest))
    assert days.united_days(layout) is None
    settings = config.simulation
    inputs = stage.scenario_inputs(layout, settings, settings.latency(config.shape.latency))
    assert not isinstance(inputs, DailyStream)


def test_the_fleet_replays_resume_too_and_price_the_quarter_as_from_scratch(
    three_days: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The capacity stage's streamed fleet replays over a union of days keep their passes
    (every request's hit tokens with them): after a day is appended each replay it asks for
    again replays that day alone, a replay no longer asked for has its pass removed, and the
    capacity files are those of a run with nothing kept."""
    path = _config(tmp_path, "daily", [str(three_days / "mooncake-{day}.jsonl")])
    raw = yaml.safe_load(path.read_text())
    raw["simulation"]["curve_exact_max_blocks"] = 0
    path.write_text(yaml.safe_dump(raw))
    config = load_config(path)
    layout = config.layout()
    kept = layout.fleet_passes

    def stages() -> list[str]:
        """The stages to the capacity, and what the capacity command said it resumed."""
        for command in ("shape", "simulate", "bench", "capacity"):
            capsys.readouterr()
            assert enginefit([command, "--config", str(path)]) == 0, capsys.readouterr().err
        return [line for line in capsys.readouterr().out.splitlines() if "day(s) replayed" in line]

    _unite(config, 2)
    before = stages()
    assert before and all("(no pass kept yet)" in line for line in before)
    assert all(line.startswith("replay b") and "-alone-per-request" in line for line in before)
    (kept / "b16_r1_c1_round_robin-alone-per-request").mkdir()  # a replay no longer asked for
    (kept / "b16_r1_c1_round_robin-alone-per-request" / MARKER).write_text("{}")

    _unite(config, 3)
    after = stages()
    assert after and all("1 day(s) replayed (2 of 3 days read back)" in line for line in after)
    assert not (kept / "b16_r1_c1_round_robin-alone-per-request").exists()
    assert {p.name for p in kept.iterdir()} == {
        line.split(":")[0][len("replay ") :] for line in after
    }
    resumed = {p.name: p.read_bytes() for p in layout.capacity.dir.glob("*.*")}

    # a what-if's capacity search (another SLO) reads the passes back and keeps none
    passes = {p: p.read_bytes() for p in kept.rglob("*") if p.is_file()}
    (kept / "b16_r1_c1_round_robin-alone-per-request").mkdir()
    what_if = capacity_stage.inputs_from(
        layout,
        bench_stage.read_analysis(layout),
        config.requirements.served_model(),
        config.catalog(),
        config.cache_replay(),
        keep_passes=False,
    )
    capacity_stage.run(what_if, config.capacity)
    assert isinstance(what_if.cache, CacheReplays) and isinstance(what_if.cache.inputs, DailyStream)
    said = what_if.cache.inputs.said
    assert said and all("(3 of 3 days read back); not kept (read only)" in line for line in said)
    assert {p: p.read_bytes() for p in kept.rglob("*") if p.is_file()} == passes
    assert (kept / "b16_r1_c1_round_robin-alone-per-request").is_dir()

    # the command with --json settles the passes too, and says so beside the JSON, not in it
    capsys.readouterr()
    assert enginefit(["capacity", "--config", str(path), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["candidates"]
    assert "kept pass of b16_r1_c1_round_robin-alone-per-request removed" in err
    assert not (kept / "b16_r1_c1_round_robin-alone-per-request").exists()
    shutil.rmtree(kept)
    capsys.readouterr()
    assert enginefit(["capacity", "--config", str(path)]) == 0
    assert all(
        "(no pass kept yet)" in line
        for line in capsys.readouterr().out.splitlines()
        if "day(s)" in line
    )
    assert {p.name: p.read_bytes() for p in layout.capacity.dir.glob("*.*")} == resumed


def test_the_sampled_curves_carry_their_gathering_on_while_the_rate_stays(
    three_days: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The curves' SHARDS sample of a union of days is kept at the end of the last day: a day
    appended is read alone and the curves are those of a reading of every day; another rate
    (the derived one halves as the table doubles) gathers every day again and says so."""
    path = _config(tmp_path, "daily", [str(three_days / "mooncake-{day}.jsonl")])
    raw = yaml.safe_load(path.read_text())
    raw["simulation"] |= {"curve_exact_max_blocks": 1, "curve_sample_rate": 0.5}
    path.write_text(yaml.safe_dump(raw))
    config = load_config(path)
    layout = config.layout()
    folder = layout.scenario_passes / "curves"

    def simulate() -> tuple[list[str], bytes]:
        capsys.readouterr()
        assert enginefit(["simulate", "--config", str(path)]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out.splitlines()
        return [line for line in out if line.startswith("sampled curves:")], (
            layout.simulation.curves.read_bytes()
        )

    _unite(config, 2)
    said, _ = simulate()
    assert said == [
        f"sampled curves: 2 day(s) replayed (no pass kept yet); the pass at the end of {DAYS[1]} "
        f"kept in {folder} ({(folder / STATE).stat().st_size / 2**20:,.1f} MiB)"
    ]
    assert json.loads((folder / MARKER).read_text())["about"] == {
        "sample rate": "50.00%",
        "block size": 512,
        "sessions inferred": True,  # the Mooncake sample logs no session; affinity curves
    }

    def gathered() -> tuple[str | None, bytes]:
        """The curves as the stage gathers them (the scenarios left alone), written."""
        settings = config.simulation
        run = stage.curves(layout, settings, settings.latency(config.shape.latency))
        stage.write_curves(run.curves, curve_points(run.curves), layout)
        return run.resumed, layout.simulation.curves.read_bytes()

    _unite(config, 3)
    note, resumed = gathered()
    assert note is not None
    assert note.startswith("sampled curves: 1 day(s) replayed (2 of 3 days read back)")
    folder.rename(folder.with_name("curves-aside"))
    note, from_scratch = gathered()
    assert note is not None and "3 day(s) replayed (no pass kept yet)" in note
    assert resumed == from_scratch

    # the derived rate: 3 days' stored blocks 2.9 times the budget, so a quarter (log2 2.9 =
    # 1.54 rounds to 2 halvings), not the half the kept pass was gathered at
    blocks = stored_blocks(layout.ingest.parts())
    derived = config.simulation.replace(
        curve_sample_rate=None, curve_exact_max_blocks=int(blocks / 2.9)
    )
    latency = derived.latency(config.shape.latency)
    curved = stage.curves(layout, derived, latency)
    assert {c.sample_rate for c in curved.curves} == {0.25}
    assert curved.resumed is not None and curved.resumed.startswith(
        "sampled curves: 3 day(s) replayed (the kept pass was made with sample rate 50.00%, "
        "now 25.00%)"
    )
    again = stage.curves(layout, derived, latency)
    assert (
        again.resumed is not None and "0 day(s) replayed (3 of 3 days read back)" in again.resumed
    )
    assert curves_frame(again.curves).equals(curves_frame(curved.curves))

    # the curves exact again (the limit raised): the kept sample is removed, and it is said
    exact = derived.replace(curve_exact_max_blocks=blocks)
    removed = stage.curves(layout, exact, latency)
    assert {c.sample_rate for c in removed.curves} == {1.0}
    assert removed.resumed == (
        f"sampled curves: the pass kept in {folder} removed (not gathered by days)"
    )
    assert not folder.exists() and folder.with_name("curves-aside").is_dir()
    assert stage.curves(layout, exact, latency).resumed is None
    # the scenarios flattened too: their kept pass is removed as well
    assert (layout.scenario_passes / "scenarios" / MARKER).is_file()
    assert not isinstance(stage.scenario_inputs(layout, exact, latency), DailyStream)
    assert not (layout.scenario_passes / "scenarios").exists()


@pytest.mark.parametrize(
    ("case", "settled"),
    [
        ("logged", True),
        ("a session missing", True),
        ("block sizes null in a part", True),
        ("no statistics", False),
        ("two block sizes", False),
    ],
)
def test_the_table_facts_from_the_parts_statistics_are_the_facts_read(
    tmp_path: Path, case: str, settled: bool
) -> None:
    """A resumed pass takes the whole table's facts from its parts' Parquet statistics (no
    value read) where they settle them, and the same facts as reading the columns; else it
    reads them (two block sizes: the same error, naming both)."""
    frames = [
        pl.DataFrame({"block_size": [16, 16, None], "session_id": ["a", "b", "c"]}),
        pl.DataFrame({"block_size": [16, 16], "session_id": ["d", "e"]}),
    ]
    frames = [f.with_columns(pl.col("block_size").cast(pl.Int32)) for f in frames]
    if case == "a session missing":
        frames[1] = frames[1].with_columns(session_id=pl.Series([None, "e"], dtype=pl.String))
    elif case == "block sizes null in a part":
        frames[0] = frames[0].with_columns(block_size=pl.lit(None, pl.Int32))
    elif case == "two block sizes":
        frames[1] = frames[1].with_columns(block_size=pl.Series([16, 32], dtype=pl.Int32))
    parts = []
    for i, frame in enumerate(frames):
        parts.append(tmp_path / f"part-{i}.parquet")
        frame.write_parquet(parts[-1], statistics=case != "no statistics")
    assert (_settled_facts(parts, True) is not None) == settled
    for needs_sessions in (False, True):
        if case == "two block sizes":
            for given in ((), parts):
                with pytest.raises(SimulationInputError, match=r"found \[16, 32\]"):
                    TableFacts.of(part_chunks(parts), needs_sessions, given)
            continue
        read = TableFacts.of(part_chunks(parts), needs_sessions)
        assert TableFacts.of(part_chunks(parts), needs_sessions, parts) == read
        assert read.infer_sessions == (needs_sessions and case == "a session missing")
        assert read.block_size == 16
