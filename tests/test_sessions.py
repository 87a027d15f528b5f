"""Session inference: hand-computed cases and a brute-force reference on random conversations."""

from __future__ import annotations

import datetime as dt
import random

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pipeline.prefix.sessions import (
    SESSIONS_SCHEMA,
    SessionInputError,
    infer_sessions,
)
from pipeline.schema import conform
from tests.prefix_oracles import infer_parents

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _frame(rows: list[dict[str, object]]) -> pl.DataFrame:
    full = []
    for i, row in enumerate(rows):
        hashes: list[int] = row.get("h", [])  # type: ignore[assignment]
        full.append(
            {
                "request_id": row.get("id", f"r{i}"),
                "arrival": T0 + dt.timedelta(seconds=float(row.get("t", i))),  # type: ignore[arg-type]
                "prefix_hashes": hashes,
                "prompt_blocks": row.get("pb", len(hashes)),  # type: ignore[arg-type]
                "hashes_known": row.get("known", True),
                "session_id": row.get("session"),
                "turn": row.get("turn"),
                "block_size": 16,
                "prompt_tokens": 16 * int(row.get("pb", len(hashes))) + 3,  # type: ignore[call-overload]
            }
        )
    return conform(
        pl.DataFrame(
            full,
            schema_overrides={
                "prefix_hashes": pl.List(pl.UInt64),
                "session_id": pl.String,
                "turn": pl.Int32,
            },
        )
    )


def _expected(
    ids: list[str], sessions: list[str], inferred: list[bool], turns: list[int]
) -> pl.DataFrame:
    return pl.DataFrame(
        {"request_id": ids, "session_id": sessions, "session_inferred": inferred, "turn": turns},
        schema=SESSIONS_SCHEMA,
    )


def test_chains_forks_and_shared_first_block() -> None:
    frame = _frame(
        [
            {"id": "a", "h": [0, 1, 2]},
            {"id": "b", "h": [0, 5]},
            {"id": "c", "h": [0, 1, 2, 3, 4], "pb": 4},  # extends a (a's 3 blocks), output block 4
            {"id": "d", "h": [0, 9]},  # shares only block 0 with everyone: new conversation
            {"id": "e", "h": [0, 1, 2, 3, 7]},  # extends c's 4 prompt blocks (longer than a's 3)
            {"id": "f", "h": [0, 5, 6]},  # extends b
        ]
    )
    got = infer_sessions(frame)
    want = _expected(
        list("abcdef"),
        ["inferred-0", "inferred-1", "inferred-0", "inferred-2", "inferred-0", "inferred-1"],
        [True] * 6,
        [0, 0, 1, 0, 2, 1],
    )
    assert_frame_equal(got, want)
    assert infer_parents(frame).to_list() == [None, None, 0, None, 2, 1]


def test_ties_go_to_the_latest_and_longest_wins_over_later_shorter() -> None:
    frame = _frame(
        [
            {"h": [1, 2, 3]},  # 0
            {"h": [1, 2, 3]},  # 1: identical prompt (retry) continues 0
            {"h": [1, 2]},  # 2: shorter; a request ending at block 2
            {"h": [1, 2, 3, 4]},  # 3: matches 2 (k=2) and 0/1 (k=3): longest, latest -> 1
            {"h": [7, 8]},  # 4: unrelated
        ]
    )
    assert infer_parents(frame).to_list() == [None, 0, None, 1, None]
    got = infer_sessions(frame)
    assert got["session_id"].to_list() == [
        "inferred-0",
        "inferred-0",
        "inferred-1",
        "inferred-0",
        "inferred-2",
    ]
    assert got["turn"].to_list() == [0, 1, 0, 2, 0]


def test_min_blocks_and_single_request() -> None:
    frame = _frame([{"h": [0, 1]}, {"h": [0, 2]}, {"h": [0, 2, 3]}, {"h": [0]}, {"h": [0, 4]}])
    # Default min 2: request 3 ends at block 0 (1 block) so it is no parent; 2 extends 1.
    assert infer_parents(frame).to_list() == [None, None, 1, None, None]
    # min 1: a one-block request is a parent, so 4 continues 3.
    assert infer_sessions(frame, min_blocks=1)["session_id"].to_list() == [
        "inferred-0",
        "inferred-1",
        "inferred-1",
        "inferred-2",
        "inferred-2",
    ]
    single = infer_sessions(_frame([{"id": "only", "h": [5, 6, 7]}]))
    assert_frame_equal(single, _expected(["only"], ["inferred-0"], [True], [0]))


def test_match_must_be_at_the_same_position() -> None:
    # Request 1 holds request 0's last hash (3) but at index 0, not index 1: no continuation.
    frame = _frame([{"h": [9, 3]}, {"h": [3, 4, 5]}])
    assert infer_parents(frame).to_list() == [None, None]


def test_partial_and_output_blocks_do_not_count_as_prompt() -> None:
    # Request 0 has 2 prompt blocks + 2 output blocks; request 1's prompt covers 0's prompt and
    # output: it continues 0 (k = 2). Request 2 matches 0 only through 0's OUTPUT block: the
    # rule uses 0's last *prompt* block, found at index 1 in request 2 too, so it also continues
    # 0 — but request 1 (k=4 blocks prompt) is longer and later.
    frame = _frame(
        [
            {"h": [1, 2, 3, 4], "pb": 2},
            {"h": [1, 2, 3, 4, 5], "pb": 5},
            {"h": [1, 2, 3, 4, 5, 6], "pb": 6},
        ]
    )
    assert infer_parents(frame).to_list() == [None, 0, 1]


def test_unknown_hashes_are_singletons_and_logged_ids_win() -> None:
    frame = _frame(
        [
            {"id": "a", "h": [1, 2], "session": "s1", "turn": 4},
            {"id": "b", "h": [1, 2, 3]},  # continues a: takes a's logged id, inferred
            {"id": "c", "h": [], "known": False},
            {"id": "d", "h": [], "known": False},
            {"id": "e", "h": [1, 2, 3, 4], "session": "s2"},  # logged id kept, no logged turn
            {"id": "f", "h": [8, 9], "session": "s1"},  # logged, no turn: rank within s1
        ]
    )
    got = infer_sessions(frame)
    want = _expected(
        list("abcdef"),
        ["s1", "s1", "inferred-0", "inferred-1", "s2", "s1"],
        [False, True, True, True, False, False],
        [4, 1, 0, 0, 0, 2],
    )
    assert_frame_equal(got, want)


def test_unsorted_input_and_bad_min_blocks_raise() -> None:
    frame = _frame([{"h": [1, 2], "t": 5}, {"h": [1, 2, 3], "t": 1}])
    with pytest.raises(SessionInputError, match="not sorted by 'arrival'"):
        infer_sessions(frame)
    with pytest.raises(SessionInputError, match=">= 1"):
        infer_sessions(_frame([{"h": [1]}]), min_blocks=0)


def test_empty_table() -> None:
    got = infer_sessions(_frame([]).clear())
    assert got.height == 0
    assert got.schema == SESSIONS_SCHEMA


def _reference_parents(rows: list[tuple[list[int], int]], min_blocks: int) -> list[int | None]:
    """Brute force: for each r scan every earlier p; longest k, latest on ties."""
    parents: list[int | None] = []
    for r, (hashes, pb) in enumerate(rows):
        best: tuple[int, int] | None = None
        for p in range(r):
            p_hashes, p_pb = rows[p]
            k = p_pb
            if k < min_blocks or k > pb:
                continue
            if hashes[k - 1] == p_hashes[k - 1] and (best is None or k >= best[0]):
                best = (k, p)
        parents.append(None if best is None else best[1])
    return parents


def _random_conversations(seed: int, n: int) -> list[tuple[list[int], int]]:
    """Conversations that extend earlier turns, shared system prompts, retries and noise.
    Hashes are chained (a tuple of the whole prefix mapped to an int) like the real chain."""
    rng = random.Random(seed)
    ids: dict[tuple[int, ...], int] = {}

    def chain(tokens: list[int]) -> list[int]:
        return [ids.setdefault(tuple(tokens[: i + 1]), len(ids)) for i in range(len(tokens))]

    systems = [[rng.randrange(3) for _ in range(rng.randrange(1, 4))] for _ in range(3)]
    open_convs: list[list[int]] = []
    rows = []
    for _ in range(n):
        u = rng.random()
        if open_convs and u < 0.5:
            conv = rng.choice(open_convs)
            conv.extend(rng.randrange(4) for _ in range(rng.randrange(0, 3)))
            prompt = list(conv)
        elif open_convs and u < 0.6:
            prompt = list(rng.choice(open_convs))  # retry of the same prompt
        else:
            prompt = list(rng.choice(systems)) + [rng.randrange(4) for _ in range(rng.randrange(3))]
            open_convs.append(prompt)
        output = [rng.randrange(4) for _ in range(rng.randrange(3))]
        rows.append((chain(prompt + output), len(prompt)))
    return rows


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("min_blocks", [1, 2, 3])
def test_matches_brute_force_reference(seed: int, min_blocks: int) -> None:
    rows = _random_conversations(seed, 150)
    frame = _frame([{"h": h, "pb": pb} for h, pb in rows])
    got = infer_parents(frame, min_blocks=min_blocks).to_list()
    assert got == _reference_parents(rows, min_blocks)
    sessions = infer_sessions(frame, min_blocks=min_blocks)
    # Same session as the parent, a fresh one otherwise.
    ids = sessions["session_id"].to_list()
    for r, p in enumerate(got):
        if p is not None:
            assert ids[r] == ids[p]
        else:
            assert ids[r] not in ids[:r]


def test_logged_ids_that_read_like_inferred_ones_share_their_turns() -> None:
    """A logged id spelled like an inferred one ("inferred-0") is the same session by name: its
    requests and the inferred conversation's are ranked together."""
    frame = _frame(
        [
            {"id": "a", "h": [1, 2]},  # starts inferred-0
            {"id": "b", "h": [9, 8], "session": "inferred-0"},  # logged, same name
            {"id": "c", "h": [1, 2, 3]},  # continues a
            {"id": "d", "h": [9, 8, 7]},  # continues b (logged id inferred-0)
            {"id": "e", "h": [5, 6], "session": "inferred-1", "turn": 7},  # no inferred-1 exists
            {"id": "g", "h": [5, 6, 1]},  # continues e
        ]
    )
    want = _expected(
        list("abcdeg"),
        ["inferred-0"] * 4 + ["inferred-1"] * 2,
        [True, False, True, True, False, True],
        [0, 1, 2, 3, 7, 1],
    )
    assert_frame_equal(infer_sessions(frame), want)
