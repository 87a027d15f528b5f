"""The ``prefix`` config section and the sessions consistency predicate."""

from __future__ import annotations

import polars as pl
import pytest

from pipeline.config import config_from_mapping
from pipeline.errors import ConfigError
from pipeline.prefix.checks import sessions_consistent


def test_values_replace_defaults() -> None:
    cfg = config_from_mapping(
        {
            "prefix": {
                "min_session_match_blocks": 3,
                "reuse_age_buckets_s": [5, 50.5],
                "block_size": 64,
            }
        }
    ).prefix
    assert cfg.min_session_match_blocks == 3
    assert cfg.reuse_age_buckets_s == (5.0, 50.5)
    assert cfg.block_size == 64


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"min_session_match_blocks": 0}, "prefix.min_session_match_blocks: Input should be"),
        ({"min_session_match_blocks": True}, "prefix.min_session_match_blocks: Input should be"),
        ({"reuse_age_buckets_s": [600, 60]}, "strictly ascending"),
        ({"reuse_age_buckets_s": [-1]}, "prefix.reuse_age_buckets_s[0]: Input should be greater"),
        ({"reuse_age_buckets_s": 60}, "prefix.reuse_age_buckets_s: Input should be a valid tuple"),
        # a threshold that became a constant (pipeline.prefix.compute) is no longer a key
        ({"no_sharing_below": 0.1}, "unknown key prefix.no_sharing_below"),
        ({"block_size": 0}, "prefix.block_size: a block size is 1 to 4096 tokens"),
        ({"min_blocks": 2}, "unknown key prefix.min_blocks"),
    ],
)
def test_bad_values_name_the_key(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_mapping({"prefix": raw})
    assert message in str(caught.value)


def test_sessions_consistent_flags_problems(monkeypatch: pytest.MonkeyPatch) -> None:
    good = pl.DataFrame(
        {
            "request_id": ["a", "b", "c"],
            "session_id": ["inferred-0", "inferred-0", "s"],
            "session_inferred": [True, True, False],
            "turn": [0, 1, 7],
        }
    )
    assert sessions_consistent(good, 3) == []
    problems = sessions_consistent(good.with_columns(pl.Series("turn", [0, 2, 7])).head(2), 3)
    assert problems == [
        "sessions: 2 rows for 3 requests",
        "sessions: 1 inferred sessions whose turns are not 0..n-1 (e.g. ['inferred-0'])",
    ]
    # turns in any order are fine; a repeat, a gap or a start past 0 is not, whatever the
    # sum; a logged session's turns are its own
    turns = {
        "in-order": [2, 0, 1],
        "repeat": [0, 0, 2],
        "gap": [0, 1, 3],
        "late": [1, 2, 3],
        "null": [0, None, 2],
    }
    frame = pl.DataFrame(
        {
            "session_id": [name for name, t in turns.items() for _ in t] + ["logged"] * 2,
            "session_inferred": [True] * 15 + [False] * 2,
            "turn": [x for t in turns.values() for x in t] + [5, 5],
        }
    )
    expected = [
        "sessions: 4 inferred sessions whose turns are not 0..n-1 (e.g. ['gap', 'late', 'null'])"
    ]
    assert sessions_consistent(frame, 17) == expected
    # Read 3 rows at a time into 6 groups of sessions: a session split across the reads is
    # still judged whole (the in-order one spans two of them).
    monkeypatch.setattr("pipeline.prefix.checks.CHECK_ROWS", 3)
    assert sessions_consistent(frame, 17) == expected
    assert sessions_consistent(frame.filter(pl.col("session_id") != "repeat").head(0), 0) == []
