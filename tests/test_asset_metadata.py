"""assets.metadata: what the UI shows of a stage's outputs."""

from __future__ import annotations

import gc

import polars as pl

from assets.metadata import frame_preview


def test_a_preview_shows_the_first_rows_and_keeps_no_reference_to_the_table() -> None:
    """Building Dagster's table types kept the caller's locals (the whole canonical table) in
    a dagster module for the rest of the run: 1.5 GiB at 10M requests."""
    table = pl.DataFrame({"request_id": [f"r{i}" for i in range(1000)], "n": range(1000)})
    preview = frame_preview(table, rows=3)
    assert [r.data["request_id"] for r in preview.value.records] == ["r0", "r1", "r2"]
    gc.collect()
    holders = [
        r["__name__"] for r in gc.get_referrers(table) if isinstance(r, dict) and "__name__" in r
    ]
    assert holders == [__name__] or holders == []  # this module's own frame at most
