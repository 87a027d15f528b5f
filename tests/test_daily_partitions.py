"""Daily partitions of the ingest: each UTC day of a quarter ingested (and re-ingested) on its
own from its own trace files, and the workload the later stages read is the union of the days,
linked rather than copied, equal to ingesting every file at once."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
import yaml
from polars.testing import assert_frame_equal

from assets import ingest as ingest_assets
from assets.days import day_assets, quarter_partitions
from assets.definitions import build_definitions
from assets.resources import EnginefitStore
from assets.shape import workload_shape as shape
from pipeline.config import load_config
from pipeline.errors import ConfigError
from pipeline.ingest import days, stage
from tests.conftest import REPO, bundled_config

DAYS = ("2025-02-21", "2025-02-22", "2025-02-23")
DAY_MS = 86_400_000
LINES = 1_500


def _day_file(folder: Path, k: int, records: list[dict[str, object]]) -> None:
    with (folder / f"mooncake-{DAYS[k]}.jsonl").open("w") as handle:
        for r in records:
            handle.write(json.dumps({**r, "timestamp": int(r["timestamp"]) + k * DAY_MS}) + "\n")  # type: ignore[call-overload]


def _sample(lines: int = LINES) -> list[dict[str, object]]:
    text = (REPO / "traces" / "mooncake" / "conversation_trace.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()[:lines]]


def _config(tmp_path: Path, name: str, traces: list[str]) -> Path:
    """The bundled configuration (anchor 2025-02-21) reading ``traces`` (Mooncake)."""
    path = bundled_config(tmp_path, name)
    raw = yaml.safe_load(path.read_text())
    raw["workload"]["traces"] = [{"path": t, "format": "mooncake"} for t in traces]
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture
def three_days(tmp_path: Path) -> Path:
    folder = tmp_path / "traces"
    folder.mkdir()
    sample = _sample()
    for k in range(len(DAYS)):
        _day_file(folder, k, sample)
    return folder


def test_the_union_of_the_days_is_the_workload_read_at_once(
    three_days: Path, tmp_path: Path
) -> None:
    """Three days ingested one by one and united give the canonical table, quarantine and counts
    of one ingest of the three files; the union's parts are links to the days', not copies."""
    daily = load_config(_config(tmp_path, "daily", [str(three_days / "mooncake-{day}.jsonl")]))
    layout = daily.layout()
    for day in DAYS:
        days.write_day(days.run_day(daily, day), layout, day)
    days.write_union(layout, days.ingested_days(layout))
    files = [str(three_days / f"mooncake-{day}.jsonl") for day in DAYS]
    whole = load_config(_config(tmp_path, "whole", files))
    stage.write(stage.run(stage.configured_inputs(whole)), whole.layout())

    assert_frame_equal(
        stage.read_requests(layout).collect(), stage.read_requests(whole.layout()).collect()
    )
    united, at_once = stage.read_summary(layout), stage.read_summary(whole.layout())
    assert (united.records_read, united.ingested, united.quarantined) == (3 * LINES, 3 * LINES, 0)
    assert united.files == at_once.files
    assert (united.first_arrival, united.last_arrival) == (
        at_once.first_arrival,
        at_once.last_arrival,
    )
    for union_part, day in zip(layout.ingest.parts(), DAYS, strict=True):
        day_part = layout.day(day).ingest.parts()[0]
        assert union_part.stat().st_ino == day_part.stat().st_ino  # linked, not copied
    manifest = json.loads(layout.ingest.manifest.read_text())
    assert sorted(manifest["days"]) == list(DAYS)


def test_a_record_of_another_day_is_quarantined_not_counted_twice(
    three_days: Path, tmp_path: Path
) -> None:
    sample = _sample()
    late = {**sample[0], "timestamp": DAY_MS + 5}  # arrives on the 22nd, logged in the 21st
    _day_file(three_days, 0, [*sample, late])
    config = load_config(_config(tmp_path, "late", [str(three_days / "mooncake-{day}.jsonl")]))
    result = days.run_day(config, DAYS[0])
    summary = result.summary
    assert (summary.records_read, summary.ingested, summary.quarantined) == (
        LINES + 1,
        LINES,
        1,
    )
    assert summary.quarantined_by_reason == {days.OUTSIDE: 1}
    (moved,) = result.quarantine.to_dicts()
    assert moved["reason"] == days.OUTSIDE and moved["source_line"] == LINES + 1
    assert summary.files[0].quarantined_by_reason == {days.OUTSIDE: 1}
    assert summary.last_arrival is not None and summary.last_arrival < "2025-02-22"


def test_every_trace_path_must_name_its_day(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path, "plain", [str(tmp_path / "all.jsonl")]))
    with pytest.raises(ConfigError, match=r"has no \{day\}"):
        days.day_config(config, DAYS[0])
    with pytest.raises(ConfigError, match="not a day"):
        days.day_window("2025-02-30")


@pytest.mark.parametrize(
    ("quarter", "bounds"),
    [("2025-Q1", ("2025-01-01", "2025-04-01")), ("2024-Q4", ("2024-10-01", "2025-01-01"))],
)
def test_a_quarter_is_its_days(quarter: str, bounds: tuple[str, str]) -> None:
    start, end = days.quarter_bounds(quarter)
    assert (start.isoformat(), end.isoformat()) == bounds
    keys = build_definitions(quarter=quarter).resolve_job_def("ingest_days").partitions_def
    assert keys is not None and keys.get_partition_keys()[0] == bounds[0]


def test_dagster_ingests_day_by_day_and_reprocesses_one_day(
    three_days: Path, tmp_path: Path
) -> None:
    """With daily partitions: each day is a partition run; the workload (union) and a later
    stage run on the days ingested, with the ingest checks; re-running one day after its file
    changed replaces that day only."""
    config = _config(tmp_path, "dagster", [str(three_days / "mooncake-{day}.jsonl")])
    day_asset, union = day_assets(quarter_partitions("2025-Q1"))
    workload_checks = ingest_assets.CHECKS
    resources = {"store": EnginefitStore(config_path=str(config))}
    layout = load_config(config).layout()
    with dg.DagsterInstance.ephemeral() as instance:
        for day in DAYS:
            assert dg.materialize(
                [day_asset], partition_key=day, resources=resources, instance=instance
            ).success

        def unite() -> dg.ExecuteInProcessResult:
            return dg.materialize(
                [day_asset, union, shape, *workload_checks],
                selection=[union, shape, *workload_checks],
                resources=resources,
                instance=instance,
            )

        result = unite()
        assert result.success
        evaluations = result.get_asset_check_evaluations()
        assert len(evaluations) == 4 and all(e.passed for e in evaluations)
        (materialized,) = [
            e
            for e in result.get_asset_materialization_events()
            if e.asset_key == dg.AssetKey("workload")
        ]
        metadata = materialized.step_materialization_data.materialization.metadata
        assert metadata["days_ingested"].value == 3
        assert metadata["request_ids_repeated_across_days"].value == 0
        assert metadata["dagster/row_count"].value == 3 * LINES

        first_day = layout.day(DAYS[0]).ingest.parts()[0].stat().st_ino
        _day_file(three_days, 1, _sample(LINES - 500))
        assert dg.materialize(
            [day_asset], partition_key=DAYS[1], resources=resources, instance=instance
        ).success
        assert unite().success
    assert stage.read_summary(layout).ingested == 3 * LINES - 500
    assert layout.day(DAYS[0]).ingest.parts()[0].stat().st_ino == first_day
    counts = pl.read_parquet(layout.shape.concurrency).height
    assert counts > 0
