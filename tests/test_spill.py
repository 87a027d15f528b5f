"""pipeline.spill.hash_groups: every row in exactly one group, a key's rows all in one,
the chunks' order kept inside a group, and the folder gone afterwards."""

from __future__ import annotations

import tempfile
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pipeline.spill import hash_groups


def test_rows_are_split_by_key_in_table_order() -> None:
    frame = pl.DataFrame({"k": [f"s{i % 37}" for i in range(500)], "row": range(500)})
    chunks = [frame.lazy().slice(at, 64) for at in range(0, 500, 64)]
    with hash_groups(chunks, "k", 5) as groups:
        got = [g.collect() for g in groups]
    assert len(got) == 5 and sum(g.height for g in got) == 500
    assert_frame_equal(pl.concat(got).sort("row"), frame)
    owners = pl.concat([g.with_columns(pl.lit(i).alias("group")) for i, g in enumerate(got)])
    assert owners.group_by("k").agg(pl.col("group").n_unique())["group"].max() == 1
    for g in got:  # each group keeps table order
        assert g["row"].is_sorted()


def test_the_folder_is_removed_even_on_error() -> None:
    before = set(Path(tempfile.gettempdir()).glob("enginefit-spill-*"))
    with pytest.raises(RuntimeError, match="boom"), hash_groups([pl.LazyFrame({"k": [1]})], "k", 2):
        raise RuntimeError("boom")
    assert set(Path(tempfile.gettempdir()).glob("enginefit-spill-*")) == before


def test_an_empty_group_is_an_empty_frame_and_groups_must_be_positive() -> None:
    with hash_groups([pl.LazyFrame({"k": ["only"], "v": [1]})], "k", 8) as groups:
        sizes = sorted(g.collect().height for g in groups)
        assert sizes == [0] * 7 + [1]
        assert all(g.collect_schema().names() == ["k", "v"] for g in groups)
    with pytest.raises(ValueError, match="groups must be >= 1, got 0"), hash_groups([], "k", 0):
        pass
