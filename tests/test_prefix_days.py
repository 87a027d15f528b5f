"""Prefix sharing of a union of days, carried on from the days read before
(pipeline.prefix.days): days appended to a kept analysis give the summary, curve and sessions
of an analysis of every day, and of the whole table, exact and with every pass sampled; a
change to what a kept pass depends on (a new tenant, a missing sessions file) reads every day
again and says why; the stage and the command on a union of ingested days write the files a
whole ingest's analysis writes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from perf.workload import canonical_frame, conversations, spec
from pipeline.cli import main as enginefit
from pipeline.config import load_config
from pipeline.ingest.days import UnitedDay
from pipeline.prefix import stage
from pipeline.prefix.analysis import FIRST, analyse
from pipeline.prefix.days import SESSIONS, analyse_days
from pipeline.prefix.result import PrefixResult
from pipeline.resume import MARKER, DayPasses
from pipeline.store import copy_parquet_atomic, json_bytes, write_parquet_atomic
from tests.conftest import DEFAULTS
from tests.test_daily_partitions import _config, _whole, three_days
from tests.test_sim_resume import _unite

__all__ = ["three_days"]  # a fixture

NAMES = ("2025-02-21", "2025-02-22", "2025-02-23", "2025-02-24")
# Every pass past its budget: the curve sampled, the shared replay stopped and sampled again,
# the same-tenant replay sampled, sessions closed early.
# (Budgets under which the three days' and the four days' rates are the same powers of two.)
LOW = {"curve_hash_budget": 12_500, "reuse_block_budget": 12_000, "session_state_budget": 300}


@pytest.fixture(scope="module")
def trace() -> pl.DataFrame:
    """3,000 generated requests at 16-token blocks, three tenants, two models."""
    return canonical_frame(conversations(spec(3_000, "short", seed=7, tenants=3, models=2)), 16)


def _days(trace: pl.DataFrame, folder: Path) -> tuple[tuple[UnitedDay, ...], tuple[Path, ...]]:
    """The trace cut into four "days" of parts (the second of two parts), written as Parquet."""
    cuts = [0, 600, 1_500, 2_300, trace.height]
    days, parts = [], []
    for k, name in enumerate(NAMES):
        rows = trace.slice(cuts[k], cuts[k + 1] - cuts[k])
        pieces = [rows.head(400), rows.slice(400)] if k == 1 else [rows]
        for i, piece in enumerate(pieces):
            path = folder / "requests" / f"{name}-{i}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_parquet_atomic(piece, path)
            parts.append(path)
        days.append(UnitedDay(name, f"digest-{name}", len(pieces)))
    return tuple(days), tuple(parts)


def _daily(days: tuple[UnitedDay, ...], parts: tuple[Path, ...], upto: int, kept: Path):
    """The first ``upto`` days as the stage reads a union, its passes kept in ``kept``."""
    count = sum(d.parts for d in days[:upto])
    return DayPasses(days[:upto], parts[:count], kept)


def _kept_then(
    table: pl.DataFrame, tmp_path: Path, first: int, then: int
) -> tuple[DayPasses, PrefixResult]:
    """``table``'s first ``first`` days analysed and kept, then its first ``then`` days
    analysed from what was kept: that run's days (with what it said) and result."""
    days, parts = _days(table, tmp_path)
    kept = tmp_path / "kept"
    analyse_days(_daily(days, parts, first, kept), DEFAULTS.prefix)
    daily = _daily(days, parts, then, kept)
    return daily, analyse_days(daily, DEFAULTS.prefix)


def _bytes(result: PrefixResult) -> tuple[bytes, bytes, bytes]:
    return (
        json_bytes(result.to_json()),
        result.curve.write_csv().encode(),
        result.sessions.collect().write_csv().encode(),
    )


@pytest.mark.parametrize(("budgets", "kept_days"), [({}, 2), (LOW, 3)], ids=["exact", "sampled"])
def test_days_appended_to_a_kept_analysis_give_the_analysis_of_every_day(
    trace: pl.DataFrame, tmp_path: Path, budgets: dict[str, int], kept_days: int
) -> None:
    """Kept after 2 days (exact: the 3rd and 4th bring longer prompts, so the curve's windows
    widen) or 3 (sampled: every rate stays put), then carried on to the 4th."""
    config = DEFAULTS.prefix.replace(**budgets)
    days, parts = _days(trace, tmp_path)
    kept = tmp_path / "kept"
    before = _daily(days, parts, kept_days, kept)
    analyse_days(before, config)
    assert all("read back" not in line for line in before.said)
    four = _daily(days, parts, 4, kept)
    resumed = analyse_days(four, config)
    replayed = 4 - kept_days
    assert all(
        f"{replayed} day(s) replayed ({kept_days} of 4 days read back)" in line
        for line in four.said
    ), four.said
    scratch = _daily(days, parts, 4, tmp_path / "scratch")
    from_scratch = analyse_days(scratch, config)
    assert _bytes(resumed) == _bytes(from_scratch)
    if not budgets:
        # exact: the whole table's analysis, byte for byte
        assert _bytes(resumed) == _bytes(analyse(trace, config))
        assert resumed.summary.estimate is None
        return
    estimate = resumed.summary.estimate
    assert estimate is not None and estimate.curve is not None and estimate.reuse is not None
    assert estimate.reuse.shared is not None and estimate.reuse.same_tenant is not None
    assert estimate.sessions is not None and estimate.sessions.closed_early > 0
    # every pass was kept: the first and the two sampled replays (the exact same-tenant replay
    # is not run when the shared one is sampled)
    assert sorted(p.name for p in kept.iterdir() if (p / MARKER).is_file()) == sorted(
        {FIRST, "shared-sampled", "same-tenant-sampled"}
    )


def test_a_day_appended_again_reads_nothing_and_rewrites_nothing(
    trace: pl.DataFrame, tmp_path: Path
) -> None:
    days, parts = _days(trace, tmp_path)
    kept = tmp_path / "kept"
    first = analyse_days(_daily(days, parts, 4, kept), DEFAULTS.prefix)
    marker = (kept / FIRST / MARKER).read_bytes()
    again = _daily(days, parts, 4, kept)
    assert _bytes(analyse_days(again, DEFAULTS.prefix)) == _bytes(first)
    assert "0 day(s) replayed (4 of 4 days read back)" in again.said[0]
    assert (kept / FIRST / MARKER).read_bytes() == marker


def test_a_new_tenant_on_an_appended_day_reads_every_day_and_says_why(
    trace: pl.DataFrame, tmp_path: Path
) -> None:
    newcomer = trace.with_columns(
        pl.when(pl.int_range(pl.len()) >= 2_900)
        .then(pl.lit("newcomer"))
        .otherwise(pl.col("tenant"))
        .alias("tenant")
    )
    four, result = _kept_then(newcomer, tmp_path, 3, 4)
    assert "4 day(s) replayed (the kept pass was made with tenants 3, now 4)" in four.said[0]
    assert _bytes(result) == _bytes(analyse(newcomer, DEFAULTS.prefix))


def test_a_missing_sessions_file_reads_every_day_and_says_why(
    trace: pl.DataFrame, tmp_path: Path
) -> None:
    days, parts = _days(trace, tmp_path)
    kept = tmp_path / "kept"
    analyse_days(_daily(days, parts, 3, kept), DEFAULTS.prefix)
    files = sorted((kept / FIRST / SESSIONS).iterdir())
    assert len(files) == 4  # one a part
    files[1].unlink()
    four = _daily(days, parts, 4, kept)
    result = analyse_days(four, DEFAULTS.prefix)
    assert f"{files[1].name}, which the kept pass names, is missing" in four.said[0]
    assert _bytes(result) == _bytes(analyse(trace, DEFAULTS.prefix))
    # the files the pass now names, and no other
    named = json.loads((kept / FIRST / MARKER).read_bytes())["files"]
    assert sorted(f"{SESSIONS}/{p.name}" for p in (kept / FIRST / SESSIONS).iterdir()) == named


def test_a_pass_no_longer_needed_is_removed(trace: pl.DataFrame, tmp_path: Path) -> None:
    days, parts = _days(trace, tmp_path)
    kept = tmp_path / "kept"
    analyse_days(_daily(days, parts, 4, kept), DEFAULTS.prefix.replace(**LOW))
    assert (kept / "shared-sampled" / MARKER).is_file()
    analyse_days(_daily(days, parts, 4, kept), DEFAULTS.prefix)  # exact again
    assert not (kept / "shared-sampled").exists()
    assert (kept / FIRST / MARKER).is_file() and (kept / "same-tenant" / MARKER).is_file()


def test_the_stage_on_a_union_of_days_writes_what_a_whole_ingest_writes(
    three_days: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two days, then the third appended, through ``enginefit prefix``: the files of the
    analysis of one ingest of the three days, and a line on what was read back. A workload
    that is not a union has the passes kept for its days before removed."""
    whole = _whole(three_days, tmp_path)
    stage.write(stage.run(stage.read_inputs(whole), DEFAULTS.prefix), whole)
    config_path = _config(tmp_path, "daily", [str(three_days / "mooncake-{day}.jsonl")])
    config = load_config(config_path)
    _unite(config, 2)
    assert enginefit(["prefix", "--config", str(config_path)]) == 0
    layout = _unite(config, 3)
    capsys.readouterr()
    assert enginefit(["prefix", "--config", str(config_path)]) == 0
    out = capsys.readouterr().out
    assert "prefix sharing: 1 day(s) replayed (2 of 3 days read back)" in out
    for name in ("summary", "curve", "sessions", "curve_svg"):
        assert getattr(layout.prefix, name).read_bytes() == getattr(whole.prefix, name).read_bytes()
    assert {p.name for p in layout.prefix_passes.iterdir()} == {FIRST, "days"}
    # a kept pass in a workload read whole (a union once) is removed when it is read
    shutil.copytree(layout.prefix_passes / FIRST, whole.prefix_passes / FIRST)
    stage.read_inputs(whole)
    assert not (whole.prefix_passes / FIRST).exists()


def test_past_the_in_memory_limit_the_sessions_files_are_copied_into_place(
    trace: pl.DataFrame, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More requests than the sessions kept in memory: the result names the parts' files (in
    order), which the stage copies into one file: the whole table's sessions."""
    monkeypatch.setattr("pipeline.prefix.days.SESSIONS_IN_MEMORY_MAX", 1_000)
    days, parts = _days(trace, tmp_path)
    result = analyse_days(_daily(days, parts, 4, tmp_path / "kept"), DEFAULTS.prefix)
    assert len(result.sessions_files) == 5  # one a part
    copy_parquet_atomic(result.sessions_files, tmp_path / "sessions.parquet")
    whole = analyse(trace, DEFAULTS.prefix).sessions.collect()
    assert_frame_equal(pl.read_parquet(tmp_path / "sessions.parquet"), whole)
    assert_frame_equal(result.sessions.collect(), whole)


def test_windows_widen_exactly_when_a_table_holds_more_blocks_than_tokens(
    trace: pl.DataFrame, tmp_path: Path
) -> None:
    """A table that bypassed ingest: long requests of the first days without their prompt
    tokens. The curve's windows reach their blocks from the start, so widening them when a
    longer prompt comes later changes nothing an analysis of every day counts."""
    first_days = pl.int_range(pl.len()) < 1_500
    odd = trace.with_columns(
        pl.when(first_days & (pl.col("prompt_tokens") >= 1_024))
        .then(None)
        .otherwise(pl.col("prompt_tokens"))
        .alias("prompt_tokens")
    )
    four, resumed = _kept_then(odd, tmp_path, 2, 4)
    scratch = analyse_days(DayPasses(four.days, four.parts, tmp_path / "scratch"), DEFAULTS.prefix)
    assert _bytes(resumed) == _bytes(scratch) == _bytes(analyse(odd, DEFAULTS.prefix))


def test_a_day_gone_from_the_end_is_named(trace: pl.DataFrame, tmp_path: Path) -> None:
    three, result = _kept_then(trace, tmp_path, 4, 3)
    assert "(day 2025-02-24, which the kept pass covers, is gone)" in three.said[0]
    assert _bytes(result) == _bytes(analyse(trace.head(2_300), DEFAULTS.prefix))
