"""A day ingested later, or one day ingested again, changes what that day changes: the other
days' part files are neither rewritten (same inode, same modification time) nor read (no
Parquet read or scan opens them) when the union is published again, and the union still equals
one ingest of every file: on days whose request ids repeat across days, with records quarantined
by the reader and arriving out of order within their file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline.config import load_config
from pipeline.ingest import days, stage
from pipeline.layout import WorkloadLayout
from pipeline.store import read_requests
from tests.test_daily_partitions import (
    DAYS,
    _assert_union_is_whole,
    _config,
    _prompt_days,
    _run_day,
    _whole,
)


def _stats(paths: list[Path]) -> dict[Path, tuple[int, int]]:
    return {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in paths}


def _day_parts(layout: WorkloadLayout, day: str) -> list[Path]:
    """The day's part files, and those of its copy in the union when it has one."""
    held = layout.day_in_union(day)
    return [*layout.day(day).ingest.parts(), *(held.ingest.parts() if held.root.is_dir() else [])]


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Path]]:
    """Every file a Parquet read, scan or schema read of Polars is given, from now on."""
    seen: list[Path] = []

    def spy(name: str) -> Any:
        real = getattr(pl, name)

        def wrapper(source: Any, *args: Any, **kwargs: Any) -> Any:
            sources = source if isinstance(source, list | tuple) else [source]
            seen.extend(Path(s).resolve() for s in sources if isinstance(s, str | Path))
            return real(source, *args, **kwargs)

        return wrapper

    for name in ("read_parquet", "scan_parquet", "read_parquet_schema"):
        monkeypatch.setattr(pl, name, spy(name))
    yield seen


def _untouched(before: dict[Path, tuple[int, int]], opened: list[Path]) -> None:
    assert _stats(list(before)) == before
    folders = {p.parent.resolve() for p in before}
    assert not [p for p in opened if p.resolve() in {q.resolve() for q in before}]
    assert not [p for p in opened if p.is_dir() and p.resolve() in folders]


def _rewrite_day(folder: Path, day: str, keep: int) -> None:
    """``day``'s file with its first ``keep`` records only (the repeats of other days' ids and
    the unusable record, appended last, dropped)."""
    path = folder / f"prompts-{day}.jsonl"
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines()[:keep]))


def test_a_later_day_and_a_day_again_leave_the_other_days_alone(
    tmp_path: Path, opened: list[Path]
) -> None:
    folder = _prompt_days(tmp_path / "prompts")
    daily = load_config(
        _config(tmp_path, "daily", [str(folder / "prompts-{day}.jsonl")], fmt="prompt-text")
    )
    layout = daily.layout()

    def ingest(day: str) -> None:
        days.write_day(_run_day(daily, day), layout, day)

    def unite() -> days.Union:
        return days.write_union(layout, days.ingested_days(layout))

    def whole(present: list[str], name: str) -> WorkloadLayout:
        """One ingest of the days' files (the others moved away meanwhile)."""
        away = tmp_path / f"away-{name}"
        away.mkdir()
        for day in set(DAYS) - set(present):
            (folder / f"prompts-{day}.jsonl").rename(away / f"prompts-{day}.jsonl")
        (tmp_path / name).mkdir()
        try:
            return _whole(folder, tmp_path / name, "prompts-{day}.jsonl", "prompt-text")
        finally:
            for moved in away.iterdir():
                moved.rename(folder / moved.name)

    # The first two days: the 22nd repeats an id of the 21st, so the union holds a copy of it.
    ingest(DAYS[0])
    ingest(DAYS[1])
    assert unite().repeated_across_days == 1
    _assert_union_is_whole(layout, whole(DAYS[:2], "two"))
    assert layout.day_in_union(DAYS[1]).ingest.manifest.is_file()

    # A later day: nothing of the first two days' parts (nor the 22nd's copy) is read or written.
    before = _stats(_day_parts(layout, DAYS[0]) + _day_parts(layout, DAYS[1]))
    opened.clear()
    ingest(DAYS[2])
    union = unite()
    _untouched(before, opened)
    assert union.repeated_across_days == 3
    _assert_union_is_whole(layout, whole(list(DAYS), "three"))
    linked = {p.stat().st_ino for p in layout.ingest.parts()}
    assert {ino for ino, _ in before.values()} - linked == {
        p.stat().st_ino for p in layout.day(DAYS[1]).ingest.parts()
    }  # the 21st's parts and the 22nd's copy are linked, not copied; the 22nd's own are not

    # The 23rd again, without its repeats: the other days stay as they are, untouched, unread;
    # its copy in the union goes, as it repeats nothing now.
    _rewrite_day(folder, DAYS[2], 40)
    before = _stats(_day_parts(layout, DAYS[0]) + _day_parts(layout, DAYS[1]))
    opened.clear()
    ingest(DAYS[2])
    union = unite()
    _untouched(before, opened)
    assert union.repeated_across_days == 1
    assert not layout.day_in_union(DAYS[2]).root.exists()
    _assert_union_is_whole(layout, whole(list(DAYS), "again"))

    # The 22nd again: the 21st and the 23rd are untouched and unread.
    _rewrite_day(folder, DAYS[1], 30)  # its repeat of the 21st's id (line 4) stays
    before = _stats(_day_parts(layout, DAYS[0]) + _day_parts(layout, DAYS[2]))
    opened.clear()
    ingest(DAYS[1])
    union = unite()
    _untouched(before, opened)
    assert union.repeated_across_days == 1
    _assert_union_is_whole(layout, whole(list(DAYS), "twice"))
    united = stage.read_summary(layout)
    assert united.duplicate_request_ids == 1
    assert united.ingested == 40 + 29 + 40
    manifest = json.loads(layout.ingest.manifest.read_text())
    assert sorted(manifest["days"]) == list(DAYS)
    kept = read_requests(layout).collect()
    assert kept["request_id"].n_unique() == kept.height
