"""The simulation stage, shared by the ``simulation_*`` assets and ``enginefit simulate``.

read → run → write, split where Dagster fans out: one step per scenario
(:func:`pipeline.sim.compute.scenario_summary` → :func:`write_scenario`), then the collected
tables (:func:`write_scenarios`), the capacity curves (:func:`curves`: exact, or a SHARDS sample
of a table too large to flatten → :func:`write_curves`) and the figures (:func:`write_figures`, from the written tables). :func:`run` and :func:`write` do
all of it in one process (the command); the files are the same either way. Paths:
:class:`pipeline.layout.SimulationPaths`.

What every scenario and curve of a workload needs is worked out once per process and shared:
:func:`read_inputs` keeps the last workload it flattened (keyed by the canonical table's files
and the latency model, :func:`pipeline.store.reuse_input`; let go of by a later stage's large
read), and that :class:`SimInputs` keeps its dense block ids per block size and its sessions
once a scenario has asked for them. So a Dagster run whose steps share a process (``enginefit
report``'s default in-process executor) flattens the table, numbers its blocks and infers its
sessions once for the curves, not once per step.

:func:`read_stream` hands the scenarios the table's part files instead, which every scenario
replays in one pass, a chunk at a time (:mod:`pipeline.sim.stream`), holding block state in
proportion to its caches and the blocks running requests pin rather than to the table (the same
summaries; :func:`pipeline.sim.compute.scenario_summary` and :func:`run` take either). The
scenarios stream past ``simulation.curve_exact_max_blocks`` stored blocks (:func:`streams`),
where the curves are sampled part by part too, so nothing flattens the table; below it they
share the flattened table with the curves, which is faster: streaming reads and flattens the
table again (a pass a scenario costs 2.6-3.4 times the CPU of the shared flattening at 1M
requests, ``perf/sim_stream.py``, so a streamed table is one step for every scenario), and
when requests outrun a replica the blocks they pin grow, up to those of the requests of the
last ``simulation.request_timeout_s``, once for every scenario replayed side by side (2.4
times the flattened path's memory on the generated 100-requests-a-second trace, measured
before that bound).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from pipeline import results
from pipeline.layout import WorkloadLayout
from pipeline.mirror import push_file
from pipeline.resume import forget_kept
from pipeline.safe_read import read_json
from pipeline.shape.facts import LatencyModel
from pipeline.sim.blocks import SimInputs, sim_input
from pipeline.sim.compute import (
    capacity_curves,
    curve_combinations,
    curve_points,
    scenario_summary,
)
from pipeline.sim.config import Scenario, SimConfig
from pipeline.sim.curve import Curve
from pipeline.sim.curve_stream import sample_rate, stored_blocks, streamable, streamed_curves
from pipeline.sim.present import hit_ratio_vs_capacity_svg, imbalance_vs_hit_ratio_svg
from pipeline.sim.result import (
    ScenarioSummary,
    SimResult,
    curves_frame,
    replica_frame,
    scenario_frame,
)
from pipeline.sim.resume import CURVES, SCENARIOS, DailyStream
from pipeline.sim.stream import RequestStream, part_chunks
from pipeline.store import (
    canonical_files,
    open_stage_output,
    read_requests,
    reuse_input,
    write_bytes_atomic,
    write_json_atomic,
    write_parquet_atomic,
)

# Durations come from ``simulation.latency_model``, else the shape section's.
SCENARIOS_STEP = results.Step(
    results.SCENARIOS, upstream=(results.REQUESTS,), sections=("simulation", "shape")
)
CURVES_STEP = results.Step(
    results.CURVES, upstream=(results.REQUESTS,), sections=("simulation", "shape")
)
FIGURES_STEP = results.Step(
    results.SIMULATION_FIGURES, upstream=(results.SCENARIOS, results.CURVES)
)
STEPS = (SCENARIOS_STEP, CURVES_STEP, FIGURES_STEP)


def _table_key(layout: WorkloadLayout, latency: LatencyModel) -> tuple[Any, ...]:
    """What a flattened table depends on: its part files (path, inode, size, modification
    time, so a rewritten part is a new key) and the latency model of its durations."""
    files = []
    for part in layout.ingest.parts():
        stat = part.stat()
        files.append((str(part.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns))
    return (tuple(files), latency)


def read_inputs(layout: WorkloadLayout, latency: LatencyModel) -> SimInputs:
    """The canonical table flattened for replay, with the latency model durations come from
    (``simulation.latency_model``, else ``shape.latency_model``: :meth:`SimConfig.latency`);
    the same object as the last call's when the table's files and the latency model are
    unchanged (the module docstring)."""
    requests = read_requests(layout)  # checks the table against its ingest manifest
    key = ("simulation", *_table_key(layout, latency))
    return reuse_input(key, lambda: sim_input(requests, latency_model=latency))


@dataclass(frozen=True)
class CurvesRun:
    """The capacity curves, and what their sample's gathering resumed (None: not a sample
    gathered by days)."""

    curves: list[Curve]
    resumed: str | None = None


def curves(layout: WorkloadLayout, settings: SimConfig, latency: LatencyModel) -> CurvesRun:
    """The capacity curves: exact from the flattened table (:func:`read_inputs`) up to
    ``simulation.curve_exact_max_blocks`` stored blocks, else a SHARDS sample
    (:func:`pipeline.sim.curve_stream.sample_rate`) taken while the parts are read one at a time
    (:mod:`pipeline.sim.curve_stream`), carried on from the days read before when the table is
    a union of days (:meth:`pipeline.sim.resume.DailyStream.gathered_curves`)."""
    read_requests(layout)  # checks the table against its ingest manifest
    parts = layout.ingest.parts()
    blocks = stored_blocks(parts)  # counted once: whether it streams, and the rate
    sampled = past_exact_limit(blocks, settings)
    combinations = curve_combinations(settings)
    if sampled and streamable(combinations):
        whole_parts = RequestStream(part_chunks(parts), latency, None)
        daily = DailyStream.streamed(layout, whole_parts, layout.scenario_passes)
        if daily is not None:
            rate = sample_rate(settings, blocks)
            return CurvesRun(daily.gathered_curves(settings, combinations, rate), daily.said[-1])
    kept = layout.scenario_passes / CURVES
    removed = (  # sampled by days no more
        f"sampled curves: the pass kept in {kept} removed (not gathered by days)"
        if forget_kept(kept, layout.remote)
        else None
    )
    if not sampled:
        return CurvesRun(capacity_curves(read_inputs(layout, latency), settings), removed)
    curved = streamed_curves(
        parts,
        settings,
        latency,
        combinations,
        lambda: read_inputs(layout, latency),
        sample_rate(settings, blocks),
    )
    return CurvesRun(curved, removed)


# Requests a streamed replay flattens and replays at once (a part holds up to a million): every
# slot table keeps a slot for each distinct block of the chunk in hand, so smaller chunks hold
# less (at 1M requests, 25k against 100k: 1.15 against 1.53 GiB for the default grid, instant
# lifetime) for about the same time, the tables' cost not growing with the number of chunks.
STREAM_ROWS = 25_000


def read_stream(layout: WorkloadLayout, latency: LatencyModel) -> RequestStream:
    """The canonical table as the scenarios stream it: its part files in order (arrival order),
    in slices of :data:`STREAM_ROWS` requests, with the latency model durations come from
    (checked against the ingest manifest here, each part's schema as it is read)."""
    read_requests(layout)  # checks the table against its ingest manifest
    chunks = part_chunks(canonical_files(layout.ingest.requests))
    return RequestStream(chunks, latency, STREAM_ROWS)


def streams(layout: WorkloadLayout, settings: SimConfig) -> bool:
    """Whether the scenarios stream the table instead of flattening it: past
    ``simulation.curve_exact_max_blocks`` stored blocks, where the curves are sampled part by
    part too, so nothing holds the flattened table."""
    return past_exact_limit(stored_blocks(layout.ingest.parts()), settings)


def past_exact_limit(blocks: int, settings: SimConfig) -> bool:
    """Whether a table of ``blocks`` stored blocks is past ``simulation.curve_exact_max_blocks``
    (streamed, and its curves sampled)."""
    return blocks > settings.curve_exact_max_blocks


ScenarioInputs = SimInputs | RequestStream | DailyStream


def scenario_inputs(
    layout: WorkloadLayout, settings: SimConfig, latency: LatencyModel
) -> ScenarioInputs:
    """What the scenarios replay: the table streamed (:func:`read_stream`) past the flattening
    limit (:func:`streams`), resumed after the days replayed before when it is a union of days
    (:mod:`pipeline.sim.resume`), else flattened and shared with the curves
    (:func:`read_inputs`)."""
    inputs: ScenarioInputs = (
        resumable_stream(layout, latency, layout.scenario_passes)
        if streams(layout, settings)
        else read_inputs(layout, latency)
    )
    if not isinstance(inputs, DailyStream):  # a pass kept before is not read again: removed
        forget_kept(layout.scenario_passes / SCENARIOS, layout.remote)
    return inputs


def resumable_stream(
    layout: WorkloadLayout, latency: LatencyModel, passes: Path, *, keeps: bool = True
) -> RequestStream | DailyStream:
    """:func:`read_stream`, its passes kept in ``passes`` and resumed after the days replayed
    before when the table is a union of days (``keeps`` False: read back, never kept)."""
    stream = read_stream(layout, latency)
    return DailyStream.streamed(layout, stream, passes, keeps=keeps) or stream


def resume_note(inputs: ScenarioInputs) -> str | None:
    """What the last replay of ``inputs`` resumed (None: a table not streamed by days)."""
    return inputs.said[-1] if isinstance(inputs, DailyStream) and inputs.said else None


def scenario_groups(layout: WorkloadLayout, settings: SimConfig) -> list[list[Scenario]]:
    """The scenarios a step replays together: one each over the flattened table (the steps run
    side by side), all of them in one pass over a streamed table (each chunk read and flattened
    once for all: a pass a scenario costs 2.6-3.4 times the CPU, ``perf/sim_stream.py``)."""
    scenarios = settings.scenarios()
    return [scenarios] if streams(layout, settings) else [[s] for s in scenarios]


def replay(
    inputs: ScenarioInputs, scenarios: list[Scenario], settings: SimConfig
) -> list[ScenarioSummary]:
    """The summaries of ``scenarios``: each replayed over the flattened table, or all in one
    pass over the streamed one (resumed where it is kept by days)."""
    if isinstance(inputs, RequestStream | DailyStream):
        runs = inputs.simulate_many(scenarios, settings)
        return [ScenarioSummary.from_json(run.summary) for run in runs]
    return [scenario_summary(inputs, s, settings) for s in scenarios]


def write_scenario(summary: ScenarioSummary, layout: WorkloadLayout) -> Path:
    open_stage_output(layout)
    path = layout.simulation.scenario(summary.scenario)
    write_json_atomic(path, summary.to_json())
    if layout.remote is not None:
        push_file(layout.remote, path)
    return path


def write_scenarios(summaries: list[ScenarioSummary], layout: WorkloadLayout) -> dict[str, Path]:
    """Every scenario in one table (sorted by key), per-replica rows, and the summaries."""
    open_stage_output(layout)
    paths = layout.simulation
    ordered = sorted(summaries, key=lambda s: s.scenario)
    write_parquet_atomic(scenario_frame(ordered), paths.scenarios)
    write_parquet_atomic(replica_frame(ordered), paths.replicas)
    write_json_atomic(paths.summary, [s.to_json() for s in ordered])
    written = {"scenarios": paths.scenarios, "replicas": paths.replicas, "summary": paths.summary}
    results.SCENARIOS.seal(layout, written.values())
    return written


def write_curves(
    curves: list[Curve], points: list[dict[str, Any]], layout: WorkloadLayout
) -> dict[str, Path]:
    open_stage_output(layout)
    paths = layout.simulation
    write_parquet_atomic(curves_frame(curves), paths.curves)
    write_json_atomic(paths.curves_json, points)
    written = {"curves": paths.curves, "curves_json": paths.curves_json}
    results.CURVES.seal(layout, written.values())
    return written


def write_figures(layout: WorkloadLayout) -> dict[str, Path]:
    """The figures, drawn from the written scenario and curve tables."""
    open_stage_output(layout)
    paths = layout.simulation
    scenarios = pl.read_parquet(paths.scenarios)
    curves = pl.read_parquet(paths.curves)
    write_bytes_atomic(paths.hit_ratio_svg, hit_ratio_vs_capacity_svg(curves, scenarios))
    write_bytes_atomic(paths.imbalance_svg, imbalance_vs_hit_ratio_svg(scenarios))
    written = {"hit_ratio_svg": paths.hit_ratio_svg, "imbalance_svg": paths.imbalance_svg}
    results.SIMULATION_FIGURES.seal(layout, written.values())
    return written


def run(
    inputs: ScenarioInputs, settings: SimConfig, curved: list[Curve] | None = None
) -> SimResult:
    """Every configured scenario and curve, one after another (the command's path). ``curved``
    are the curves when already worked out (:func:`curves`), else the exact ones of the
    flattened table, which streamed scenarios (``inputs`` a :class:`RequestStream`, every
    scenario in one pass over the table) do not have."""
    summaries = replay(inputs, settings.scenarios(), settings)
    if curved is None:
        if not isinstance(inputs, SimInputs):
            raise ValueError("streamed scenarios need their curves given (stage.curves)")
        curved = capacity_curves(inputs, settings)
    return SimResult(summaries, curved, curve_points(curved))


def write(result: SimResult, layout: WorkloadLayout) -> dict[str, Path]:
    written = {f"scenario_{s.scenario}": write_scenario(s, layout) for s in result.summaries}
    written |= write_scenarios(result.summaries, layout)
    written |= write_curves(result.curves, result.curve_points, layout)
    written |= write_figures(layout)
    return written


def read_summaries(layout: WorkloadLayout) -> list[ScenarioSummary]:
    """The collected scenario summaries (what later stages read)."""
    return [ScenarioSummary.from_json(s) for s in read_json(results.SCENARIOS.require(layout))]


def read_curves(layout: WorkloadLayout) -> pl.DataFrame:
    """Every step of every written capacity curve (what later stages read)."""
    return pl.read_parquet(results.CURVES.require(layout))
