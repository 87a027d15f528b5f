"""Daily partitions of the ingest: each UTC day of a quarter ingested (and re-ingested) on its
own from its own trace files, configured by ``workload.daily_quarter``; a day without records is
an empty day; and the workload the later stages read is the union of the days, linked rather
than copied, with request ids repeated across days quarantined, equal to ingesting every file at
once."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
import yaml
from polars.testing import assert_frame_equal

from assets import ingest as ingest_assets
from assets.days import configured_quarter, day_assets, quarter_partitions
from assets.definitions import build_definitions, definitions_for, report_job_def, run_full_graph
from assets.resources import EnginefitStore
from assets.shape import workload_shape as shape
from pipeline.commands.ingest import configured_inputs
from pipeline.config import Config, load_config
from pipeline.errors import ConfigError, InputFormatError
from pipeline.ingest import days, stage
from pipeline.ingest.result import IngestResult, IngestSummary
from pipeline.layout import WorkloadLayout
from pipeline.store import read_requests
from tests.conftest import REPO, bundled_config

DAYS = ("2025-02-21", "2025-02-22", "2025-02-23")
DAY_MS = 86_400_000
LINES = 1_500


def _run_day(config: Config, day: str) -> IngestResult:
    """One day ingested as the ``workload_day`` asset ingests it."""
    return days.run_day(config.require_workload(), config.base, day, where=config.where)


def _day_file(folder: Path, k: int, records: list[dict[str, object]]) -> None:
    with (folder / f"mooncake-{DAYS[k]}.jsonl").open("w") as handle:
        for r in records:
            handle.write(json.dumps({**r, "timestamp": int(r["timestamp"]) + k * DAY_MS}) + "\n")  # type: ignore[call-overload]


def _sample(lines: int = LINES) -> list[dict[str, object]]:
    text = (REPO / "traces" / "mooncake" / "conversation_trace.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()[:lines]]


def _config(
    tmp_path: Path, name: str, traces: list[str], fmt: str = "mooncake", **workload: object
) -> Path:
    """The bundled configuration (anchor 2025-02-21) reading ``traces`` (``fmt``); daily over
    2025-Q1 when the paths name their {day}."""
    path = bundled_config(tmp_path, name)
    raw = yaml.safe_load(path.read_text())
    raw["workload"]["traces"] = [{"path": t, "format": fmt} for t in traces]
    if any("{day}" in t for t in traces):
        raw["workload"]["daily_quarter"] = "2025-Q1"
    raw["workload"].update(workload)
    path.write_text(yaml.safe_dump(raw))
    return path


def _daily_union(folder: Path, tmp_path: Path, name: str = "daily") -> WorkloadLayout:
    """Every day of DAYS ingested from ``folder`` on its own, then united."""
    daily = load_config(_config(tmp_path, name, [str(folder / "mooncake-{day}.jsonl")]))
    layout = daily.layout()
    for day in DAYS:
        days.write_day(_run_day(daily, day), layout, day)
    days.write_union(layout, days.ingested_days(layout))
    return layout


def _whole(
    folder: Path, tmp_path: Path, name: str = "mooncake-{day}.jsonl", fmt: str = "mooncake"
) -> WorkloadLayout:
    """One ingest of the days' files there are in ``folder`` (in day order, each named as the
    daily configuration names it), the way without partitions."""
    files = [str(folder / name.replace("{day}", day)) for day in DAYS]
    present = [f for f in files if Path(f).exists()]
    whole = load_config(_config(tmp_path, "whole", present, fmt))
    stage.write(stage.run(configured_inputs(whole)), whole.layout())
    return whole.layout()


def _without_notes(summary: IngestSummary) -> IngestSummary:
    """A summary without its prose: the union's notes name their day, and each day warns about
    its own files where one ingest warns once about all of them."""
    return dataclasses.replace(summary, notes=[], warnings=[])


def _assert_union_is_whole(union: WorkloadLayout, whole: WorkloadLayout) -> None:
    assert_frame_equal(read_requests(union).collect(), read_requests(whole).collect())
    assert_frame_equal(
        pl.read_parquet(union.ingest.quarantine), pl.read_parquet(whole.ingest.quarantine)
    )
    united = stage.read_summary(union)
    assert _without_notes(united) == _without_notes(stage.read_summary(whole))
    assert united.records_read == united.ingested + united.quarantined
    for f in united.files:
        assert f.records_read == f.ingested + f.quarantined
        assert f.quarantined == sum(f.quarantined_by_reason.values())


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
    layout = _daily_union(three_days, tmp_path)
    _assert_union_is_whole(layout, _whole(three_days, tmp_path))
    united = stage.read_summary(layout)
    assert (united.records_read, united.ingested, united.quarantined) == (3 * LINES, 3 * LINES, 0)
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
    result = _run_day(config, DAYS[0])
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


# ---------------------------------------------------------------------------------------------
# The configuration key: workload.daily_quarter.


def test_the_quarter_is_configuration_and_the_definitions_follow_it(tmp_path: Path) -> None:
    """``workload.daily_quarter`` in the configuration file gives the definitions built from
    that file (the code location's, and ``enginefit report --config FILE``'s) their daily
    partitions; a file without it, or no file, gives none."""
    daily = _config(tmp_path, "daily", [str(tmp_path / "mooncake-{day}.jsonl")])
    assert load_config(daily).require_workload().daily_quarter == "2025-Q1"
    assert configured_quarter(daily) == "2025-Q1"
    job = definitions_for("2025-Q1").resolve_job_def("ingest_days")
    assert job.partitions_def is not None
    assert job.partitions_def.get_partition_keys()[0] == "2025-01-01"
    daily_report = definitions_for("2025-Q1").resolve_job_def("full_report")
    assert report_job_def(str(daily)) is daily_report
    assert configured_quarter(REPO / "enginefit.yaml") is None
    assert configured_quarter(tmp_path / "none.yaml") is None
    plain = report_job_def(str(REPO / "enginefit.yaml"))
    assert plain is definitions_for(None).resolve_job_def("full_report") is not daily_report


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        (
            {"daily_quarter": "2025-Q5"},
            "workload.daily_quarter: '2025-Q5' is not a quarter: write YYYY-Qn",
        ),
        ({"daily_quarter": 2025}, "workload.daily_quarter: Input should be a valid string"),
        (
            {"daily_quater": "2025-Q1"},
            "unknown key workload.daily_quater (did you mean daily_quarter?)",
        ),
        (
            {"daily_quarter": "2025-Q1", "traces": ["all.jsonl"]},
            "workload: traces: all.jsonl has no {day}: with workload.daily_quarter every trace "
            "path names its day",
        ),
        (
            {"daily_quarter": None},
            "workload: traces: t-{day}.jsonl names {day}, which only daily ingest fills: set "
            "workload.daily_quarter (YYYY-Qn)",
        ),
    ],
)
def test_a_bad_daily_quarter_is_one_line_naming_the_key(
    workload: dict[str, object], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Loading fails with one ConfigError line naming the file and the key; a command exits 2
    with it, and so do the definitions built from that file."""
    from pipeline.cli import main

    path = tmp_path / "bad.yaml"
    raw = {"workload": {"name": "w", "traces": ["t-{day}.jsonl"], "hash_salt": "s", **workload}}
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    text = str(caught.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text
    with pytest.raises(ConfigError, match="daily_qua"):
        configured_quarter(path)
    assert main(["config", "--config", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_a_day_must_be_of_the_configured_quarter(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path, "q", [str(tmp_path / "m-{day}.jsonl")]))
    with pytest.raises(ConfigError, match=r"2025-04-01 is not a day of workload\.daily_quarter"):
        _run_day(config, "2025-04-01")
    with pytest.raises(ConfigError, match="not a day"):
        days.day_window("2025-02-30")
    plain = load_config(_config(tmp_path, "plain", [str(tmp_path / "all.jsonl")]))
    with pytest.raises(ConfigError, match=r"workload\.daily_quarter is not set"):
        _run_day(plain, DAYS[0])


# ---------------------------------------------------------------------------------------------
# Empty days.


def test_a_day_without_a_file_is_an_empty_day_and_the_union_stays_whole(
    three_days: Path, tmp_path: Path
) -> None:
    """No file for the 22nd: that day is ingested as empty (zero requests, counts reconciled, a
    note saying why), and the union equals one ingest of the files there are."""
    (three_days / f"mooncake-{DAYS[1]}.jsonl").unlink()
    layout = _daily_union(three_days, tmp_path)
    empty = stage.read_summary(layout.day(DAYS[1]))
    assert (empty.records_read, empty.ingested, empty.quarantined, empty.files) == (0, 0, 0, [])
    assert any("no trace file for 2025-02-22" in n and "an empty day" in n for n in empty.notes)
    assert read_requests(layout.day(DAYS[1])).collect().height == 0
    _assert_union_is_whole(layout, _whole(three_days, tmp_path))
    assert stage.read_summary(layout).ingested == 2 * LINES


def test_a_day_whose_records_all_arrive_elsewhere_is_empty(
    three_days: Path, tmp_path: Path
) -> None:
    """Every record of the 22nd's file arrives on the 23rd: the 22nd ingests nothing and
    quarantines all of them (outside_partition), and the union counts each record once."""
    _day_file(three_days, 1, [{**r, "timestamp": int(r["timestamp"]) + DAY_MS} for r in _sample()])  # type: ignore[call-overload]
    layout = _daily_union(three_days, tmp_path)
    day = stage.read_summary(layout.day(DAYS[1]))
    assert (day.records_read, day.ingested, day.quarantined) == (LINES, 0, LINES)
    assert (day.first_arrival, day.last_arrival, day.span_s) == (None, None, 0.0)
    united = stage.read_summary(layout)
    assert (united.records_read, united.ingested) == (3 * LINES, 2 * LINES)
    assert united.quarantined_by_reason == {days.OUTSIDE: LINES}


# ---------------------------------------------------------------------------------------------
# Request ids repeated across days.

T0 = 1_740_096_000  # 2025-02-21T00:00:00Z, epoch seconds


def _prompt_days_united(tmp_path: Path) -> tuple[Path, Config, WorkloadLayout, days.Union]:
    """:func:`_prompt_days` ingested day by day and united: their folder, the configuration,
    the workload and its union."""
    folder = _prompt_days(tmp_path / "prompts")
    daily = load_config(
        _config(tmp_path, "daily", [str(folder / "prompts-{day}.jsonl")], fmt="prompt-text")
    )
    layout = daily.layout()
    for day in DAYS:
        days.write_day(_run_day(daily, day), layout, day)
    return folder, daily, layout, days.write_union(layout, days.ingested_days(layout))


def _prompt_days(folder: Path) -> Path:
    """Three days of prompt-text records with their own ids, where the 22nd repeats an id of
    the 21st (logged late in its file, so dropping it changes the out-of-order count), the 23rd
    repeats ids of both and one of its own, and a record with no prompt is quarantined by the
    reader."""
    folder.mkdir()
    for k, day in enumerate(DAYS):
        base = T0 + k * 86_400
        records: list[dict[str, object]] = [
            {
                "ts": base + 60 * i,
                "prompt": f"day {day} question {i} " * 4,
                "request_id": f"{day}/{i}",
            }
            for i in range(40)
        ]
        if k == 1:
            records.insert(
                3, {"ts": base + 50_000, "prompt": "again", "request_id": f"{DAYS[0]}/7"}
            )
        if k == 2:
            records += [
                {"ts": base + 9_000, "prompt": "again", "request_id": f"{DAYS[0]}/8"},
                {"ts": base + 9_001, "prompt": "again", "request_id": f"{DAYS[1]}/9"},
                {"ts": base + 9_002, "prompt": "again", "request_id": f"{DAYS[2]}/1"},
                {"ts": base + 9_003, "request_id": "no-prompt"},
            ]
        lines = "".join(json.dumps(r) + "\n" for r in records)
        (folder / f"prompts-{day}.jsonl").write_text(lines)
    return folder


def test_request_ids_repeated_across_days_are_quarantined_as_in_one_ingest(
    tmp_path: Path,
) -> None:
    """The union keeps the earliest day's record of a repeated id and quarantines the later
    ones as duplicate_request_id, per file and in total, with every count reconciled: the same
    table, quarantine and summary as one ingest of every file (whose first file wins)."""
    folder, _, layout, union = _prompt_days_united(tmp_path)
    whole = _whole(folder, tmp_path, "prompts-{day}.jsonl", "prompt-text")

    _assert_union_is_whole(layout, whole)
    assert union.repeated_across_days == 3
    united = stage.read_summary(layout)
    assert united.duplicate_request_ids == 4  # three across days, one within the 23rd
    assert united.quarantined_by_reason["duplicate_request_id"] == 4
    assert united.records_read == 3 * 40 + 1 + 4
    assert united.ingested == 3 * 40
    # The 22nd's repeat arrives late in its file, putting the rest out of order until dropped.
    assert stage.read_summary(layout.day(DAYS[1])).out_of_order > 0
    assert united.out_of_order == stage.read_summary(whole).out_of_order == 0
    repeated = pl.read_parquet(layout.ingest.quarantine).filter(
        pl.col("reason") == "duplicate_request_id"
    )
    assert repeated.height == 4
    kept = read_requests(layout).collect()
    assert kept["request_id"].n_unique() == kept.height
    # Each day's own set is untouched: only the union quarantines across days.
    assert stage.read_summary(layout.day(DAYS[1])).ingested == 41
    manifest = json.loads(layout.ingest.manifest.read_text())
    assert sorted(manifest["days"]) == list(DAYS)
    linked = (
        layout.ingest.parts()[0].stat().st_ino
        == layout.day(DAYS[0]).ingest.parts()[0].stat().st_ino
    )
    assert linked  # the 21st repeats nothing: still a link


def test_re_ingesting_a_day_replaces_that_day_only(three_days: Path, tmp_path: Path) -> None:
    """A day ingested again replaces its own set and nothing else: the other days' parts are
    the same files, a file enginefit did not write in the day's folder stays, and a run that
    fails leaves the previous set readable."""
    layout = _daily_union(three_days, tmp_path)
    config = load_config(_config(tmp_path, "daily", [str(three_days / "mooncake-{day}.jsonl")]))
    others = {d: layout.day(d).ingest.parts()[0].stat().st_ino for d in (DAYS[0], DAYS[2])}
    foreign = layout.day(DAYS[1]).root / "notes.txt"
    foreign.write_text("mine")
    _day_file(three_days, 1, _sample(LINES - 500))
    days.write_day(_run_day(config, DAYS[1]), layout, DAYS[1])
    assert stage.read_summary(layout.day(DAYS[1])).ingested == LINES - 500
    assert {d: layout.day(d).ingest.parts()[0].stat().st_ino for d in others} == others
    assert foreign.read_text() == "mine"
    assert stage.read_summary(layout).ingested == 3 * LINES  # the union until published again
    days.write_union(layout, days.ingested_days(layout))
    assert stage.read_summary(layout).ingested == 3 * LINES - 500

    (three_days / f"mooncake-{DAYS[1]}.jsonl").unlink()
    (three_days / f"mooncake-{DAYS[1]}.jsonl").mkdir()  # no trace in it: the read fails
    with pytest.raises(InputFormatError, match="holds no trace files"):
        days.write_day(_run_day(config, DAYS[1]), layout, DAYS[1])
    assert stage.read_summary(layout.day(DAYS[1])).ingested == LINES - 500


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
    three_days: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With daily partitions: each day is a partition run (a day without a file materialises
    as an empty day, with a note); the workload (union) and a later stage run on the days
    ingested, with the ingest checks; re-running one day after its file changed replaces that
    day only, and the shape (its exact limit lowered, so it measures day by day) measures
    that day alone again."""
    monkeypatch.setattr("pipeline.shape.compute.EXACT_MAX_REQUESTS", 100)
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
        empty = dg.materialize(
            [day_asset], partition_key="2025-02-24", resources=resources, instance=instance
        )
        assert empty.success
        (event,) = empty.get_asset_materialization_events()
        day_metadata = event.step_materialization_data.materialization.metadata
        assert day_metadata["dagster/row_count"].value == 0
        assert day_metadata["records_read"].value == 0
        assert "an empty day" in str(day_metadata["notes"].value)

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
        assert metadata["days_ingested"].value == 4
        assert metadata["days_empty"].value == "2025-02-24"
        assert metadata["request_ids_repeated_across_days"].value == 0
        assert metadata["dagster/row_count"].value == 3 * LINES
        assert _day_parts_note(result) == "per-day parts: 9 computed, 0 read back"

        first_day = layout.day(DAYS[0]).ingest.parts()[0].stat().st_ino
        _day_file(three_days, 1, _sample(LINES - 500))
        assert dg.materialize(
            [day_asset], partition_key=DAYS[1], resources=resources, instance=instance
        ).success
        again = unite()
        assert again.success
        assert _day_parts_note(again) == "per-day parts: 3 computed, 6 read back"
    assert stage.read_summary(layout).ingested == 3 * LINES - 500
    assert layout.day(DAYS[0]).ingest.parts()[0].stat().st_ino == first_day
    counts = pl.read_parquet(layout.shape.concurrency).height
    assert counts > 0


def _day_parts_note(result: dg.ExecuteInProcessResult) -> str:
    """The shape asset's ``day_parts`` metadata, without the folder it names."""
    (event,) = [
        e
        for e in result.get_asset_materialization_events()
        if e.asset_key == dg.AssetKey("workload_shape")
    ]
    text = str(event.step_materialization_data.materialization.metadata["day_parts"].value)
    return text.split(" (kept in ")[0]


@pytest.mark.usefixtures("pdf_as_its_html")
def test_the_report_of_a_daily_configuration_runs_on_the_union(
    three_days: Path, tmp_path: Path
) -> None:
    """``enginefit report --config FILE`` runs the job of FILE's definitions: with
    workload.daily_quarter, every asset but workload_day, the workload being the union of the
    days ingested (not an ingest of the {day} paths); its streamed replays say what they kept."""
    config = _config(tmp_path, "report", [str(three_days / "mooncake-{day}.jsonl")])
    raw = yaml.safe_load(config.read_text())
    raw["simulation"]["curve_exact_max_blocks"] = 1_000  # streamed: the replays keep passes
    config.write_text(yaml.safe_dump(raw))
    loaded = load_config(config)
    layout = loaded.layout()
    for day in DAYS:
        days.write_day(_run_day(loaded, day), layout, day)
    with dg.DagsterInstance.ephemeral() as instance:
        run = run_full_graph(config, instance)
    assert run.success, run.failures
    prefix, fleet, curves, scenarios = sorted(run.resumed)  # by name: the order may vary
    assert prefix.startswith("prefix sharing: 3 day(s) replayed (no pass kept yet)")
    assert scenarios.startswith("scenario replay: 3 day(s) replayed (no pass kept yet)")
    assert curves.startswith("sampled curves: 3 day(s) replayed (no pass kept yet)")
    assert fleet.startswith("replay b512_r1_")
    assets = {asset for asset, _, _ in run.outputs}
    assert "workload" in assets and "workload_day" not in assets
    assert json.loads(layout.ingest.manifest.read_text())["days"].keys() == set(DAYS)
    assert stage.read_summary(layout).ingested == 3 * LINES
