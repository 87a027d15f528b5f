"""The ``prefix`` config section and the sessions consistency predicate."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from pipeline.errors import ConfigError
from pipeline.prefix import PrefixConfig, parse_prefix_config
from pipeline.prefix.stage import sessions_consistent


def test_defaults_and_values() -> None:
    assert parse_prefix_config({}) == PrefixConfig()
    cfg = parse_prefix_config(
        {"min_session_match_blocks": 3, "reuse_age_buckets_s": [5, 50.5], "block_size": 64}
    )
    assert cfg.min_session_match_blocks == 3
    assert cfg.reuse_age_buckets_s == (5.0, 50.5)
    assert cfg.block_size == 64


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"min_session_match_blocks": 0}, "min_session_match_blocks"),
        ({"min_session_match_blocks": True}, "min_session_match_blocks"),
        ({"reuse_age_buckets_s": [600, 60]}, "strictly ascending"),
        ({"reuse_age_buckets_s": [-1]}, "positive seconds"),
        ({"reuse_age_buckets_s": 60}, "positive seconds"),
        ({"no_sharing_below": 1.5}, "no_sharing_below"),
        ({"classify_short_window_tokens": 4096}, "must exceed"),
        ({"block_size": 0}, "block_size"),
        ({"min_blocks": 2}, "unknown option"),
    ],
)
def test_bad_values_name_the_key(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_prefix_config(raw)


def test_sessions_consistent_flags_problems(tmp_path: Path) -> None:
    requests = pl.LazyFrame({"request_id": ["a", "b", "c"]})
    path = tmp_path / "sessions.parquet"
    assert sessions_consistent(requests, path) == [f"{path}: missing"]
    good = pl.DataFrame(
        {
            "request_id": ["a", "b", "c"],
            "session_id": ["inferred-0", "inferred-0", "s"],
            "session_inferred": [True, True, False],
            "turn": [0, 1, 7],
        }
    )
    good.write_parquet(path)
    assert sessions_consistent(requests, path) == []
    good.with_columns(pl.Series("turn", [0, 2, 7])).head(2).write_parquet(path)
    problems = sessions_consistent(requests, path)
    assert len(problems) == 2
    assert "2 rows for 3 requests" in problems[0]
    assert "turns are not 0..n-1" in problems[1]
