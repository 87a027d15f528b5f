"""The shape stage from per-day parts (pipeline.shape.daily), forced with a tiny
``exact_max_requests``: on generated multi-day workloads every figure equals the whole-table
one (inter-turn gap percentiles within the sketch's error, float sums to their last digits),
and parts kept on disk are read back, so a day ingested again costs that day alone."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from functools import cache
from pathlib import Path

import dagster as dg
import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from assets.days import quarter_partitions, shape_day_asset
from assets.resources import EnginefitStore
from perf.workload import canonical_frame, conversations, spec
from pipeline.bench.latency_fit import estimate_concurrency
from pipeline.bench.stage import CONCURRENCY_POINTS
from pipeline.cli import main as enginefit
from pipeline.commands.ingest import configured_inputs as ingest_inputs
from pipeline.config import load_config
from pipeline.errors import ConfigError
from pipeline.ingest import days as ingest_days
from pipeline.ingest import stage as ingest_stage
from pipeline.schema import conform
from pipeline.shape import stage as shape_stage
from pipeline.shape.common import ShapeError
from pipeline.shape.compute import compute_shape
from pipeline.shape.daily import DailyParts, DaySource, PartStore, counted_day
from pipeline.shape.result import ShapeResult
from pipeline.shape.stage import ModelSweeps
from pipeline.store import read_requests
from tests.conftest import bundled_config
from tests.test_bench_latency_fit import fits_of, point
from tests.test_daily_partitions import (
    DAYS,
    LINES,
    _config,
    _daily_union,
    _prompt_days_united,
    _run_day,
    three_days,
)
from tests.test_shape_chunked import CFG, _compare, _workloads

__all__ = ["three_days"]  # a fixture


@cache
def _quantised_days() -> pl.DataFrame:
    """Two and a half days at minute-quantised timestamps (ties in most minutes, so the
    quantisation holds), half the durations logged."""
    frame = canonical_frame(conversations(spec(12_000, "short", seed=5, rate_rps=0.06)), None)
    rng = np.random.default_rng(11)
    e2e = np.where(rng.random(frame.height) < 0.5, rng.exponential(9e4, frame.height), np.nan)
    return frame.with_columns(
        pl.col("arrival").dt.truncate("1m"), pl.Series("e2e_ms", e2e).fill_nan(None)
    )


def _frame(name: str) -> pl.DataFrame:
    return _quantised_days() if name == "quantised" else _workloads()[name]


def day_sources(frame: pl.DataFrame, digest: str | None = "v1") -> list[DaySource]:
    days = frame.select(pl.col("arrival").dt.date().unique().sort()).to_series().to_list()
    return [
        DaySource(
            d.isoformat(),
            frame.lazy().filter(pl.col("arrival").dt.date() == d),
            None if digest is None else f"{digest}-{d}",
        )
        for d in days
    ]


def daily_result(
    frame: pl.DataFrame, store: PartStore, digest: str | None = "v1", exact_max_requests: int = 100
) -> ShapeResult:
    parts = DailyParts(day_sources(frame, digest), store)
    return compute_shape(frame, CFG, exact_max_requests=exact_max_requests, days=parts)


@pytest.mark.parametrize("name", ["days", "quantised"])
def test_days_merged_equal_the_whole_table(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sessions' days merged in hash groups of about 700 rows (about ten groups).
    monkeypatch.setattr("pipeline.shape.daily.SESSION_GROUP_ROWS", 700)
    frame = _frame(name)
    exact = compute_shape(frame, CFG)
    daily = daily_result(frame, PartStore(tmp_path))
    a, b = exact.to_json(), daily.to_json()
    note = b.pop("percentiles_sketched")
    assert note["method"].endswith("merged across days (Masson et al., PVLDB 2019)")
    b.pop("percentile_method"), a.pop("percentile_method")
    _compare(a, b)
    # Exact where the whole table's are: lengths and turns come from counts, not sketches.
    assert b["lengths"] == a["lengths"]
    if name == "days":
        assert b["sessions"]["turns_per_session"] == a["sessions"]["turns_per_session"]
        assert a["sessions"]["sessions"] > 1000 and a["arrivals"]["day_of_week"]["supported"]
    assert_frame_equal(exact.concurrency_series, daily.concurrency_series)
    assert exact.plots is not None and daily.plots is not None
    assert_frame_equal(exact.plots.arrival_series, daily.plots.arrival_series)
    for curve in ("prompt", "output"):
        assert_frame_equal(exact.plots.length_cdfs[curve], daily.plots.length_cdfs[curve])
    assert [f.id for f in exact.findings] == [f.id for f in daily.findings]
    if name == "quantised":
        assert a["arrivals"]["quantisation"]["quantised"] and a["concurrency"]["estimated"]
        assert a["concurrency"]["durations_logged"] > 0


def test_a_quarter_too_short_for_day_buckets_is_measured_in_chunks(tmp_path: Path) -> None:
    """Five minutes of traffic: the plot's buckets are finer than a day part's, so the days
    are not used (and nothing is kept)."""
    frame = _workloads()["quantised"]
    got = daily_result(frame, PartStore(tmp_path))
    assert got.metrics.percentiles_sketched is not None
    assert got.metrics.percentiles_sketched.method.endswith(
        "across chunks (Masson et al., PVLDB 2019)"
    )


def test_conversations_crossing_midnight_are_carried() -> None:
    """The generated days really hold sessions that continue the next day, and their steps
    across midnight are counted (the gaps are as many as the whole table's)."""
    frame = _workloads()["days"]
    spread = (
        frame.filter(pl.col("session_id").is_not_null())
        .group_by("session_id")
        .agg(pl.col("arrival").dt.date().n_unique().alias("days"))
    )
    assert spread.filter(pl.col("days") > 1).height > 0


def test_a_session_over_three_days_has_its_steps_by_hand(tmp_path: Path) -> None:
    """Session "a" has turns on 1, 2 and (twice) 4 January, none on the 3rd, where session
    "b" has its one turn."""
    t0 = dt.datetime(2025, 1, 1, 23, 59, tzinfo=dt.UTC)
    rows = [  # (arrival, session, prompt tokens)
        (t0, "a", 100),
        (t0 + dt.timedelta(seconds=100), "a", 300),  # 2 Jan 00:00:40
        (t0 + dt.timedelta(days=1, hours=3), "b", 50),  # 3 Jan 02:59
        (t0 + dt.timedelta(days=2, seconds=130), "a", 250),  # 4 Jan 00:01:10
        (t0 + dt.timedelta(days=3), "a", 400),  # 4 Jan 23:59
    ]
    frame = conform(
        pl.DataFrame(
            {
                "request_id": [f"r{i}" for i in range(len(rows))],
                "arrival": [r[0] for r in rows],
                "session_id": [r[1] for r in rows],
                "prompt_tokens": [r[2] for r in rows],
                "output_tokens": [10] * len(rows),
            }
        )
    )
    store = PartStore(tmp_path)
    got = daily_result(frame, store, exact_max_requests=1).to_json()["sessions"]
    assert store.computed["DayCounts"] == 4
    # Steps of "a": +100 s (+200 tokens), +2 days + 30 s (−50), +1 day − 130 s (+150).
    gaps = [100.0, 2 * 86_400 + 30.0, 86_400 - 130.0]
    assert got["sessions"] == 2 and got["multi_turn_sessions"] == 1
    assert got["turns_per_session"]["max"] == 4.0 and got["turns_per_session"]["min"] == 1.0
    assert got["inter_turn_gap_s"]["count"] == 3
    assert got["inter_turn_gap_s"]["mean"] == pytest.approx(sum(gaps) / 3, rel=1e-12)
    assert got["inter_turn_gap_s"]["max"] == max(gaps)
    growth = got["history_growth_tokens"]
    assert (growth["count"], growth["min"], growth["max"]) == (3, -50.0, 200.0)
    assert growth["negative_steps"] == 1 and growth["mean"] == pytest.approx(100.0)


def _json(result: ShapeResult) -> dict[str, object]:
    return result.to_json()


def test_parts_are_read_back_and_a_changed_day_is_computed_alone(tmp_path: Path) -> None:
    frame = _workloads()["days"]
    store = PartStore(tmp_path)
    first = daily_result(frame, store)
    days = len(day_sources(frame))
    assert store.computed == {"DayCounts": days, "DayGaps": days, "DaySweep": days}
    again = PartStore(tmp_path)
    assert _json(daily_result(frame, again)) == _json(first)
    assert again.computed == {}
    # One day ingested anew (another digest): its counts and gaps alone are made again, and
    # the sweeps of the days its carried requests reach (the same here, so none after it).
    sources = day_sources(frame)
    changed = [
        DaySource(s.day, s.requests, "v2" if i == 3 else s.digest) for i, s in enumerate(sources)
    ]
    third = PartStore(tmp_path)
    got = compute_shape(frame, CFG, exact_max_requests=100, days=DailyParts(changed, third))
    assert _json(got) == _json(first)
    assert third.computed == {"DayCounts": 1, "DayGaps": 1, "DaySweep": 1}
    # The older part of that day is gone, the others stay.
    assert len(list((tmp_path / sources[3].day).glob("DayCounts-*"))) == 1


def test_a_day_added_later_costs_that_day(tmp_path: Path) -> None:
    frame = _workloads()["days"]
    sources = day_sources(frame)
    last_day = dt.date.fromisoformat(sources[-1].day)
    earlier = frame.filter(pl.col("arrival").dt.date() < last_day)
    store = PartStore(tmp_path)
    daily_result(earlier, store)
    later = PartStore(tmp_path)
    got = daily_result(frame, later)
    assert later.computed == {"DayCounts": 1, "DayGaps": 1, "DaySweep": 1}
    assert _json(got) == _json(daily_result(frame, PartStore(tmp_path / "fresh")))


def test_without_a_digest_nothing_is_kept(tmp_path: Path) -> None:
    frame = _workloads()["days"]
    store = PartStore(tmp_path)
    daily_result(frame, store, digest=None)
    assert not any(tmp_path.iterdir())
    assert store.computed["DayCounts"] == len(day_sources(frame))


def test_the_stage_measures_a_union_of_days_from_its_days(
    three_days: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Three days of the Mooncake sample ingested as partitions: the shape stage reads them
    from per-day parts (its limit lowered), the figures are the whole table's; one day
    ingested again is the one day computed again."""
    monkeypatch.setattr("pipeline.shape.compute.EXACT_MAX_REQUESTS", 100)
    layout = _daily_union(three_days, tmp_path)
    inputs = shape_stage.read_inputs(layout)
    assert inputs.days is not None and [s.day for s in inputs.days.sources] == list(DAYS)
    got = shape_stage.run(inputs, CFG)
    exact = compute_shape(read_requests(layout), CFG, exact_max_requests=10**9)
    a, b = exact.to_json(), got.to_json()
    assert "days" in b.pop("percentiles_sketched")["method"]
    b.pop("percentile_method"), a.pop("percentile_method")
    _compare(a, b)
    assert_frame_equal(exact.concurrency_series, got.concurrency_series)
    assert shape_stage.days_note(inputs) == (
        f"per-day parts: 9 computed, 0 read back (kept in {layout.shape_day_parts})"
    )
    # The 22nd again, 200 records fewer: that day's parts alone are computed.
    path = three_days / f"mooncake-{DAYS[1]}.jsonl"
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines()[:-200]))
    config = load_config(tmp_path / "daily.yaml")
    ingest_days.write_day(_run_day(config, DAYS[1]), layout, DAYS[1])
    ingest_days.write_union(layout, ingest_days.ingested_days(layout))
    again = shape_stage.read_inputs(layout)
    result = shape_stage.run(again, CFG)
    assert again.days is not None
    assert again.days.store.computed == {"DayCounts": 1, "DayGaps": 1, "DaySweep": 1}
    fresh = DailyParts(again.days.sources, PartStore(tmp_path / "fresh"))
    assert _json(result) == _json(
        compute_shape(read_requests(layout), CFG, exact_max_requests=100, days=fresh)
    )
    assert result.metrics.requests == 3 * LINES - 200
    # The command says what it did: every part read back now.
    assert enginefit(["shape", "--config", str(tmp_path / "daily.yaml")]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith(
        f"per-day parts: 0 computed, 9 read back (kept in {layout.shape_day_parts})"
    )


def test_days_out_of_order_are_refused_by_name(tmp_path: Path) -> None:
    frame = _workloads()["days"]
    shuffled = frame.sample(fraction=1.0, shuffle=True, seed=3)
    with pytest.raises(ShapeError, match="per-day concurrency sweep needs them in order"):
        daily_result(shuffled, PartStore(tmp_path))


def test_a_damaged_part_is_made_again(tmp_path: Path) -> None:
    frame = _workloads()["days"]
    first = daily_result(frame, PartStore(tmp_path))
    day = day_sources(frame)[2].day
    (counts,) = (tmp_path / day).glob("DayCounts-*")
    (counts / "sessions.parquet").unlink()
    (sweep,) = (tmp_path / day).glob("DaySweep-*")
    (sweep / "part.json").write_text("{not json")
    again = PartStore(tmp_path)
    assert _json(daily_result(frame, again)) == _json(first)
    assert again.computed == {"DayCounts": 1, "DaySweep": 1}


def test_a_day_ingested_again_while_it_was_counted_is_not_kept(tmp_path: Path) -> None:
    """A part is kept only if the day's set is still the one its key names once it is made."""
    (source, *_) = day_sources(_workloads()["days"])
    changed = dataclasses.replace(source, unchanged=lambda: False)
    store = PartStore(tmp_path)
    with pytest.raises(ShapeError, match=f"{source.day}: the day's requests were ingested again"):
        counted_day(changed, store)
    assert list(tmp_path.rglob("part.json")) == [] and store.computed == {}
    assert counted_day(dataclasses.replace(source, unchanged=lambda: True), store) is not None
    assert [p.parent.name.split("-")[0] for p in tmp_path.rglob("part.json")] == ["DayCounts"]


def test_a_backfill_of_shape_days_counts_them_ahead_of_the_stage(
    three_days: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``workload_shape_day`` partitions count their days (each in a run of its own, as a
    backfill runs them side by side); the stage then reads those counts back and computes
    only the gaps and the sweeps. Below the limit the partitions say they are not needed."""
    layout = _daily_union(three_days, tmp_path)
    config = tmp_path / "daily.yaml"
    asset = shape_day_asset(quarter_partitions("2025-Q1"))
    resources = {"store": EnginefitStore(config_path=str(config))}

    def materialise(day: str) -> str:
        result = dg.materialize([asset], partition_key=day, resources=resources)
        (event,) = result.get_asset_materialization_events()
        return str(event.step_materialization_data.materialization.metadata["day_parts"].value)

    assert materialise(DAYS[0]) == (
        f"not needed: {3 * LINES:,} requests are measured as one table (up to 20,000,000)"
    )
    monkeypatch.setattr("pipeline.shape.compute.EXACT_MAX_REQUESTS", 100)
    for day in DAYS:
        assert materialise(day).startswith("per-day parts: 1 computed, 0 read back")
    assert materialise("2025-03-01") == "2025-03-01: not in the workload's union (not ingested yet)"
    inputs = shape_stage.read_inputs(layout)
    shape_stage.run(inputs, CFG)
    assert inputs.days is not None
    assert inputs.days.store.computed == {"DayGaps": 3, "DaySweep": 3}
    assert inputs.days.store.read == {"DayCounts": 3}


def test_a_day_counted_ahead_reads_the_set_the_union_holds_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Days whose requests repeat an earlier day's ids are held by the union without them (a
    copy): counting a day ahead reads the set the union holds, and the stage reads every
    count back. A day ingested again after the union was written is refused by its manifest
    until the union is written again."""
    monkeypatch.setattr("pipeline.shape.compute.EXACT_MAX_REQUESTS", 10)
    folder, daily, layout, _ = _prompt_days_united(tmp_path)
    held = [ingest_days.held_day_set(layout, day) for day in DAYS]
    assert [h == layout.day(d) for h, d in zip(held, DAYS, strict=True)] == [True, False, False]
    for day in DAYS:
        assert shape_stage.count_day(layout, day).startswith("per-day parts: 1 computed, 0 read")
    inputs = shape_stage.read_inputs(layout)
    counted = shape_stage.run(inputs, CFG)
    assert inputs.days is not None and inputs.days.store.read == {"DayCounts": 3}
    fresh = compute_shape(read_requests(layout), CFG, exact_max_requests=10**9)
    assert counted.metrics.requests == fresh.metrics.requests == 3 * 40

    path = folder / f"prompts-{DAYS[0]}.jsonl"
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines()[:-1]))
    ingest_days.write_day(_run_day(daily, DAYS[0]), layout, DAYS[0])
    changed = layout.day(DAYS[0]).ingest.manifest
    with pytest.raises(ConfigError, match=f"{changed}: the day's set changed after the"):
        shape_stage.count_day(layout, DAYS[0])


def test_counting_a_day_before_the_union_is_written_names_what_to_materialise(
    three_days: Path, tmp_path: Path
) -> None:
    daily = load_config(_config(tmp_path, "daily", [str(three_days / "mooncake-{day}.jsonl")]))
    layout = daily.layout()
    ingest_days.write_day(_run_day(daily, DAYS[0]), layout, DAYS[0])
    with pytest.raises(
        ConfigError, match="union of days is not written yet; materialise `workload`"
    ):
        shape_stage.count_day(layout, DAYS[0])


def test_counting_a_day_of_a_workload_not_of_days_is_refused(tmp_path: Path) -> None:
    config = load_config(bundled_config(tmp_path, "plain"))
    ingest_stage.write(ingest_stage.run(ingest_inputs(config)), config.layout())
    with pytest.raises(ConfigError, match="the workload was not published from days"):
        shape_stage.count_day(config.layout(), "2025-02-21")


def test_the_concurrency_by_engine_of_a_union_of_days_is_swept_day_by_day(
    three_days: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The configured and each fitted latency model's concurrency of a union of days (above
    the shape's exact limit) are merged from the days' sweeps, kept per model, and equal the
    whole table's sweep; a day ingested again is swept again alone, under each model; a
    model no longer fitted has its sweeps removed."""
    monkeypatch.setattr("pipeline.shape.compute.EXACT_MAX_REQUESTS", 100)
    layout = _daily_union(three_days, tmp_path)
    # two fitted models (TPOT 5 and 8 ms) and a candidate without one
    fits = fits_of(
        [point("a", 2.0, True), point("b", 2.0, True, tpot_p50_ms=8.0), point("z", 1.0, False)]
    )
    model = CFG.latency

    def by_days() -> tuple[pl.DataFrame, ModelSweeps]:
        sweeps = ModelSweeps.of(layout, read_requests(layout), CONCURRENCY_POINTS)
        return estimate_concurrency(read_requests(layout), fits, model, sweep=sweeps), sweeps

    table, sweeps = by_days()
    assert not layout.shape_day_parts.exists()  # the days' counts are the shape stage's to make
    whole = estimate_concurrency(read_requests(layout), fits, model, max_points=10)
    assert_frame_equal(table, whole)
    assert table["peak_concurrency"].null_count() == 1  # z: no model
    root = layout.concurrency_day_parts
    assert sweeps.settle() == (
        f"per-day sweeps of 3 latency model(s): 9 computed, 0 read back (kept in {root})"
    )
    stale = root / ("0" * 16) / DAYS[0] / f"DaySweep-{'0' * 24}"
    stale.mkdir(parents=True)
    (stale / "part.json").write_text("{}")
    (root / "notes").mkdir()  # not a model's folder: left alone

    # The 22nd again, 200 records fewer: that day's sweep alone is made again, under each
    # model (the 23rd's is read back: the requests carried into it are the same).
    path = three_days / f"mooncake-{DAYS[1]}.jsonl"
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines()[:-200]))
    config = load_config(tmp_path / "daily.yaml")
    ingest_days.write_day(_run_day(config, DAYS[1]), layout, DAYS[1])
    ingest_days.write_union(layout, ingest_days.ingested_days(layout))
    again, sweeps = by_days()
    assert_frame_equal(again, estimate_concurrency(read_requests(layout), fits, model))
    assert [(s.computed, s.read) for s in sweeps.stores.values()] == [
        ({"DaySweep": 1}, {"DaySweep": 2})
    ] * 3
    assert sweeps.settle() is not None
    assert {p.name for p in root.iterdir()} == {*sweeps.stores, "notes"}

    # The command, with the benchmark's own fits: it says what the sweeps cost, beside the JSON
    assert enginefit(["bench", "--config", str(tmp_path / "daily.yaml"), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["points"] and "per-day sweeps" not in out
    said = [line for line in err.splitlines() if line.startswith("concurrency by engine:")]
    assert len(said) == 1 and f"read back (kept in {root})" in said[0]
