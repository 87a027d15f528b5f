"""Capacity curves of a table too large to flatten: a SHARDS sample kept while the request parts
are read (pipeline.sim.curve_stream), checked against the exact curve of the same table.

The workload is perf.workload's generated chat trace over almost three days (60k requests,
block size 16, 2 models, 20,000 system prompts: about 0.9M stored blocks), published as four
request parts in arrival order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from perf import workload
from pipeline.config import default_config
from pipeline.ingest.days import UnitedDay
from pipeline.layout import WorkloadLayout
from pipeline.resume import KeptPass
from pipeline.sim import stage
from pipeline.sim.blocks import sim_input
from pipeline.sim.compute import capacity_curves, curve_combinations
from pipeline.sim.config import SimConfig
from pipeline.sim.curve import CURVE_SCHEMA, Curve
from pipeline.sim.curve_stream import (
    CurveGathering,
    _largest_gap,
    gathering_facts,
    sample_rate,
    stored_blocks,
    streamed_curves,
)
from pipeline.sim.present import curve_sampling_brief, curve_sampling_note
from pipeline.sim.result import curves_frame
from pipeline.sim.stream import StreamPass, part_chunks
from pipeline.store import publish_ingest

BLOCK = 16
CONFIG = default_config()
LATENCY = CONFIG.shape.latency


def _settings(**changes: object) -> SimConfig:
    base = {"block_sizes": (BLOCK,), "replicas": (1, 4), "routings": ("round-robin", "random")}
    return CONFIG.simulation.model_copy(update=base | changes)


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> WorkloadLayout:
    trace = workload.conversations(
        workload.spec(
            60_000, "short", system_prompts=20_000, zipf=0.6, rate_rps=0.25, models=2, tenants=3
        )
    )
    assert trace.arrival_us.max() > 2.5 * 86_400e6  # several days
    frames = list(workload.iter_frames(trace, BLOCK, chunk=15_000))
    found = WorkloadLayout(tmp_path_factory.mktemp("sampled") / "generated")
    publish_ingest(found, frames)
    return found


@pytest.fixture(scope="module")
def exact(layout: WorkloadLayout) -> list[Curve]:
    inputs = sim_input(pl.scan_parquet(layout.ingest.parts()), latency_model=LATENCY)
    return capacity_curves(inputs, _settings())


def _streamed(layout: WorkloadLayout, settings: SimConfig, rate: float) -> list[Curve]:
    parts = layout.ingest.parts()
    assert len(parts) == 4
    return streamed_curves(
        parts, settings, LATENCY, curve_combinations(settings), lambda: pytest.fail(), rate
    )


def _gap(a: Curve, b: Curve, from_blocks: float = 0) -> float:
    """Largest hit-ratio difference at capacities of at least ``from_blocks`` blocks."""
    caps = np.union1d(a.capacity_blocks, b.capacity_blocks)
    caps = caps[caps >= from_blocks]

    def at(c: Curve) -> np.ndarray:
        i = np.searchsorted(c.capacity_blocks, caps, side="right") - 1
        return np.where(i >= 0, c.hit_tokens[np.maximum(i, 0)], 0) / c.coverage.prompt_tokens

    return float(np.abs(at(a) - at(b)).max())


def test_the_stored_blocks_are_counted_from_the_parts_metadata(layout: WorkloadLayout) -> None:
    chains = pl.scan_parquet(layout.ingest.parts()).select(
        pl.col("prefix_hashes").list.len().sum(), pl.len()
    )
    blocks, rows = chains.collect().row(0)
    counted = stored_blocks(layout.ingest.parts())
    assert blocks <= counted <= blocks + rows and blocks > 800_000


@pytest.mark.parametrize("isolated", [False, True])
def test_a_sample_of_every_block_is_the_exact_curve(layout: WorkloadLayout, isolated: bool) -> None:
    # Rate 1 keeps every block: the part-by-part path (namespaces numbered across parts,
    # chains strided to 32-token blocks, unknown output blocks, round-robin and random replicas
    # drawn part by part) must then give the exact curves to the token.
    # Every routing a curve assigns while reading: least-served's counters, the affinities'
    # sessions and bounded-affinity's spills carried from part to part.
    settings = _settings(
        block_sizes=(BLOCK, 2 * BLOCK),
        tenant_isolation=isolated,
        routings=("round-robin", "random", "least-served", "affinity", "bounded-affinity"),
    )
    parts = layout.ingest.parts()[:2]  # half the trace: enough to cross a part boundary
    reference = capacity_curves(sim_input(pl.scan_parquet(parts), latency_model=LATENCY), settings)
    streamed = streamed_curves(
        parts, settings, LATENCY, curve_combinations(settings), lambda: pytest.fail(), 1.0
    )
    assert [(c.block_size, c.replicas, c.routing) for c in streamed] == [
        (c.block_size, c.replicas, c.routing) for c in reference
    ]
    for got, want in zip(streamed, reference, strict=True):
        np.testing.assert_array_equal(got.capacity_blocks, want.capacity_blocks)
        np.testing.assert_array_equal(got.hit_tokens, want.hit_tokens)
        assert got.coverage == want.coverage and got.prompt_tokens == want.prompt_tokens
    assert {c.routing for c in streamed} == {"single", *settings.routings}


@pytest.mark.parametrize("rate", [0.01, 0.1])
def test_the_sampled_curve_is_within_a_hundredth_of_the_exact_one(
    layout: WorkloadLayout, exact: list[Curve], rate: float
) -> None:
    sampled = _streamed(layout, _settings(), rate)
    for got, want in zip(sampled, exact, strict=True):
        assert got.sample_rate == rate and not got.as_dict()["exact"]
        # From 100/rate blocks per replica (a hundred sampled blocks deep) the sample is within
        # 0.01 of the exact hit ratio (measured: at most 0.005); below that it cannot resolve
        # depths (a sampled depth of one stands for 1/rate blocks), and the stated error
        # covers every capacity, so it is not far below the largest gap anywhere.
        assert _gap(got, want, from_blocks=100 / rate) <= 0.01
        assert got.hit_ratio_error is not None
        assert got.hit_ratio_error >= _gap(got, want) / 2
        assert _gap(got, want) == pytest.approx(
            _largest_gap(
                (got.capacity_blocks, got.hit_tokens),
                (want.capacity_blocks, want.hit_tokens),
                want.coverage.prompt_tokens,
            )
        )


def test_a_routing_that_needs_the_whole_table_takes_the_same_sample(
    layout: WorkloadLayout,
) -> None:
    settings = _settings(routings=("round-robin", "least-loaded"))
    parts = layout.ingest.parts()
    whole = sim_input(pl.scan_parquet(parts), latency_model=LATENCY)
    from_memory = streamed_curves(
        parts, settings, LATENCY, curve_combinations(settings), lambda: whole, 0.05
    )
    read = _streamed(layout, _settings(routings=("round-robin",)), 0.05)
    assert [c.routing for c in from_memory] == ["single", "round-robin", "least-loaded"]
    for a, b in zip(from_memory[:2], read, strict=True):
        np.testing.assert_array_equal(a.capacity_blocks, b.capacity_blocks)
        np.testing.assert_array_equal(a.hit_tokens, b.hit_tokens)
        assert a.hit_ratio_error == b.hit_ratio_error


def test_the_stage_samples_only_above_the_configured_size(
    layout: WorkloadLayout, exact: list[Curve]
) -> None:
    blocks = stored_blocks(layout.ingest.parts())
    at_the_limit = stage.curves(layout, _settings(curve_exact_max_blocks=blocks), LATENCY).curves
    for got, want in zip(at_the_limit, exact, strict=True):
        assert got.sample_rate == 1.0 and got.hit_ratio_error == 0.0
        np.testing.assert_array_equal(got.hit_tokens, want.hit_tokens)
    assert curves_frame(at_the_limit).equals(curves_frame(exact))
    over = stage.curves(layout, _settings(curve_exact_max_blocks=blocks - 1), LATENCY)
    # null rate: the power of two nearest the budget's share, below one
    assert over.resumed is None and {c.sample_rate for c in over.curves} == {0.5}
    thin = _settings(curve_exact_max_blocks=blocks // 4, curve_sample_rate=0.02)
    assert sample_rate(thin, blocks) == 0.02


@pytest.mark.parametrize(
    ("budget", "blocks", "rate"),
    [
        (100, 101, 0.5),  # just over: the largest rate below one
        (100, 282, 0.5),  # share 1/2.82: log2 1.496, nearer 1/2
        (100, 283, 0.25),  # share 1/2.83: log2 1.501, nearer 1/4
        (100, 400, 0.25),
        (100_000_000, 855_000_000, 0.125),  # 100M requests of perf.e2e's workload: 11.7 %
        (100_000_000, 1_200_000_000, 0.0625),  # log2 12 = 3.58
        (0, 10, 2.0**-19),  # no budget: the smallest power of two above MIN_SAMPLE_RATE
        (1, 10**12, 2.0**-19),
    ],
)
def test_the_budget_rate_is_a_power_of_two(budget: int, blocks: int, rate: float) -> None:
    assert sample_rate(_settings(curve_exact_max_blocks=budget), blocks) == rate


def test_the_record_and_the_document_state_the_sample(
    layout: WorkloadLayout, exact: list[Curve]
) -> None:
    sampled = _streamed(layout, _settings(), 0.01)
    frame = curves_frame(sampled)
    assert set(frame["sample_rate"]) == {0.01}
    errors = [c.hit_ratio_error for c in sampled]
    assert frame.group_by("routing").agg(pl.col("hit_ratio_error").first()).height == 3
    assert max(frame["hit_ratio_error"]) == max(e for e in errors if e is not None)
    point = sampled[0].as_dict()
    assert point["exact"] is False and point["hit_ratio_error"] == errors[0]
    note = curve_sampling_note(frame)
    assert note is not None
    assert "1.00% spatial sample of cache blocks (SHARDS, Waldspurger et al., FAST 2015)" in note
    assert f"±{max(e for e in errors if e is not None):.3f} hit ratio" in note
    assert "10,000 blocks per replica" in note
    brief = curve_sampling_brief(frame)
    assert brief is not None and brief.startswith("from a 1.00% SHARDS spatial sample")
    assert curve_sampling_note(curves_frame(exact)) is None
    assert curve_sampling_brief(curves_frame(exact)) is None
    # an exact curve's record is the one exact curves always had: no sampling columns or key
    assert curves_frame(exact).columns == [
        c for c in CURVE_SCHEMA.names() if c not in ("sample_rate", "hit_ratio_error")
    ]
    assert "hit_ratio_error" not in exact[0].as_dict() and exact[0].as_dict()["exact"] is True


def test_parts_out_of_arrival_order_are_refused(layout: WorkloadLayout, tmp_path: Path) -> None:
    from pipeline.sim.blocks import SimulationInputError

    parts = layout.ingest.parts()
    settings = _settings(replicas=(1,))
    with pytest.raises(SimulationInputError, match="not in arrival order"):
        streamed_curves(
            [parts[1], parts[0]],
            settings,
            LATENCY,
            curve_combinations(settings),
            lambda: pytest.fail(),
            0.1,
        )


@pytest.mark.parametrize("routings", [("round-robin",), ("affinity",)])
def test_a_block_size_finer_than_the_stored_one_is_the_exact_paths_error(
    layout: WorkloadLayout, routings: tuple[str, ...]
) -> None:
    """Streamed parts and the whole table (a routing that needs it) alike: one line naming
    the block size, not a division by zero."""
    from pipeline.sim.blocks import SimulationInputError

    settings = _settings(block_sizes=(BLOCK // 2,), routings=routings)
    with pytest.raises(SimulationInputError, match="block size 8 is not a positive multiple"):
        streamed_curves(
            layout.ingest.parts(),
            settings,
            LATENCY,
            curve_combinations(settings),
            lambda: sim_input(pl.scan_parquet(layout.ingest.parts()), latency_model=LATENCY),
            0.1,
        )


def test_the_command_says_its_curves_are_sampled(
    layout: WorkloadLayout,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pipeline.cli import main
    from pipeline.sim.result import ScenarioSummary

    config = tmp_path / "enginefit.yaml"
    config.write_text(
        f"workload: {{name: {layout.root.name}, traces: [unused.jsonl], hash_salt: s}}\n"
        f"paths: {{data_dir: {layout.root.parent}, reports_dir: {tmp_path / 'reports'}}}\n"
        f"simulation: {{block_sizes: [{BLOCK}], replicas: [1], routings: [round-robin], "
        "curve_exact_max_blocks: 1000, request_lifetime: instant}\n"
    )
    with monkeypatch.context() as patched:
        # past the limit the scenarios stream too: nothing flattens the whole table
        patched.setattr(stage, "sim_input", lambda *a, **k: pytest.fail("flattened"))
        assert main(["simulate", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "spatial sample of cache blocks (SHARDS, Waldspurger et al., FAST 2015)" in out
    settings = _settings(replicas=(1,), routings=("round-robin",), request_lifetime="instant")
    flat = stage.replay(stage.read_inputs(layout, LATENCY), settings.scenarios(), settings)
    written = stage.read_summaries(layout)
    assert [s.to_json() for s in written] == [s.to_json() for s in flat]
    assert all(isinstance(s, ScenarioSummary) for s in written)


def test_a_sample_that_kept_no_block_is_unknown_not_zero(layout: WorkloadLayout) -> None:
    """The thinnest rate on a quarter of this table keeps none of its blocks: every curve is
    unknown with the reason and the remedy, and still says it was sampled."""
    from pipeline.sim.config import MIN_SAMPLE_RATE

    parts = layout.ingest.parts()[:1]
    settings = _settings()
    curves = streamed_curves(
        parts, settings, LATENCY, curve_combinations(settings), pytest.fail, MIN_SAMPLE_RATE
    )
    for curve in curves:
        assert curve.unknown_reason is not None
        assert curve.unknown_reason.startswith("the 0.0001% sample of blocks kept none")
        assert curve.unknown_reason.endswith(
            "raise simulation.curve_sample_rate (or curve_exact_max_blocks)"
        )
        shown = curve.as_dict()
        assert shown["max_hit_ratio"] is None and shown["points"] == []
        assert shown["hit_unknown_reason"] == curve.unknown_reason
    frame = curves_frame(curves)
    assert frame["hit_tokens"].null_count() == frame.height == len(curves)
    assert curve_sampling_note(frame) is not None  # the document still says it is sampled


def test_a_gathering_kept_between_parts_and_fed_the_rest_gives_one_readings_curves(
    layout: WorkloadLayout, tmp_path: Path
) -> None:
    # Every state the gathering carries: the sample's numbering and per-request rows, the
    # namespaces (tenants isolated) numbered across parts, the random generator, least-served's
    # and bounded-affinity's counters, the sessions inferred (the trace logs none).
    settings = _settings(
        block_sizes=(BLOCK, 2 * BLOCK),
        tenant_isolation=True,
        routings=("round-robin", "random", "least-served", "bounded-affinity"),
    )
    parts = layout.ingest.parts()
    combinations = curve_combinations(settings)
    whole = streamed_curves(parts, settings, LATENCY, combinations, lambda: pytest.fail(), 0.25)
    facts = gathering_facts(part_chunks(parts), combinations)
    assert facts.infer_sessions
    about = {"sample rate": "25.00%"}
    for cut in (1, 3):  # kept after one part, then after three of the four
        first = CurveGathering(settings, combinations, 0.25, facts, LATENCY)
        first.feed(part_chunks(parts[:cut]))
        # kept and read back as the stage does (pickled, zstd-compressed, its digest checked)
        kept = KeptPass(tmp_path / f"kept-{cut}", None)
        days = (UnitedDay("first", "a", cut), UnitedDay("then", "b", len(parts) - cut))
        kept.keep(first, "key", days[:1], about)
        del first
        back, why = kept.read_back("key", days, CurveGathering, about)
        assert back is not None, why
        resumed, covered = back
        assert covered == 1 and resumed.requests > 0
        resumed.feed(part_chunks(parts[cut:]))
        got = resumed.finish()
        assert curves_frame(got).equals(curves_frame(whole))
        assert [c.hit_ratio_error for c in got] == [c.hit_ratio_error for c in whole]
        assert {c.routing for c in got} == {"single", *settings.routings}

    wrong, why = kept.read_back("key", days, StreamPass, {})
    assert wrong is None and "is not the pass" in why  # a gathering is no scenario replay
    # another key: what changed among the inputs the line names is named
    changed = {"sample rate": "12.50%", "sessions inferred": True}
    other, why = kept.read_back("other", days, CurveGathering, changed)
    assert other is None and why == (
        "the kept pass was made with sample rate 25.00%, now 12.50%; sessions inferred None, "
        "now True"
    )
    other, why = kept.read_back("other", days, CurveGathering, about)
    assert other is None and why == "the kept pass was made with other settings or code"
