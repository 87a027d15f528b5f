"""Prefix-sharing curve, reuse potential, retention, tenants and classification on hand-computed
traces, plus a brute-force reference on random conversations."""

from __future__ import annotations

import datetime as dt
import random

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pipeline.prefix.analysis import analyse
from pipeline.prefix.compute import (
    PrefixInputError,
    classify_curve,
    curve_rate,
    window_grid,
)
from pipeline.prefix.present import curve_svg
from pipeline.prefix.reuse import reuse_summary
from pipeline.schema import conform
from tests.conftest import DEFAULTS
from tests.prefix_oracles import at_block_size, reuse_per_request, sharing_curve

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
B = 4


def _frame(rows: list[dict[str, object]], block_size: int = B) -> pl.DataFrame:
    full = [
        {
            "request_id": f"r{i}",
            "arrival": T0 + dt.timedelta(seconds=float(row["t"])),  # type: ignore[arg-type]
            "prompt_tokens": row["prompt"],
            "output_tokens": row.get("output", 0),
            "prefix_hashes": row["h"],
            "prompt_blocks": row.get("pb", int(row["prompt"]) // block_size),  # type: ignore[call-overload]
            "hashes_known": row.get("known", True),
            "tenant": row.get("tenant"),
            "block_size": block_size,
        }
        for i, row in enumerate(rows)
    ]
    return conform(
        pl.DataFrame(
            full, schema_overrides={"prefix_hashes": pl.List(pl.UInt64), "tenant": pl.String}
        )
    )


# Block size 4. Hashes are letters of a chain: A = first block, AB = A then B, ...
A, AB, ABC, AD, ADE, ADEF = 1, 2, 3, 4, 5, 6
HAND = [
    {"t": 0, "prompt": 10, "output": 6, "h": [A, AB, ABC], "tenant": "x"},  # ABC is an output block
    {"t": 30, "prompt": 8, "output": 0, "h": [A, AB], "tenant": "y"},  # prompt = 2 full blocks
    {"t": 100, "prompt": 17, "h": [A, AD, ADE, ADEF], "tenant": "x"},
    {"t": 200, "prompt": 3, "h": [], "tenant": "x"},  # shorter than one block
    {"t": 1000, "prompt": 12, "h": [A, AB, ABC], "tenant": "y"},  # extends r0's prompt+output
]


def test_window_grid() -> None:
    assert window_grid(4, 17) == [4, 8, 16]
    assert window_grid(16, 16) == [16]
    assert window_grid(16, 3) == [16]  # W larger than every prompt: one window, nobody eligible
    assert window_grid(10, 45) == [10, 20, 40]  # B·2^j when B is not a power of two


def test_curve_rate_is_the_nearest_power_of_two_to_the_budgets_share() -> None:
    # exact while the hashes fit; past them the 2^-k nearest (log scale) to (budget // 8) / hashes
    assert curve_rate(800, 800) == 1.0
    assert curve_rate(801, 800) == 1 / 8  # 100 / 801 is just under 1/8
    assert curve_rate(1131, 800) == 1 / 8  # 100 / 1131 > 2^-3.5
    assert curve_rate(1132, 800) == 1 / 16  # 100 / 1132 < 2^-3.5
    # a table growing by days keeps its rate until its hashes double
    assert curve_rate(5656, 1000) == 1 / 32
    assert curve_rate(5657, 1000) == curve_rate(11313, 1000) == 1 / 64
    assert curve_rate(11314, 1000) == 1 / 128


def test_sharing_curve_hand_computed() -> None:
    got = sharing_curve(_frame(HAND), B)
    want = pl.DataFrame(
        {
            "window_tokens": [4, 8, 16],
            "window_blocks": [1, 2, 4],
            "requests": [5, 5, 5],
            "eligible": [4, 4, 1],
            "sharing": [4, 3, 0],
            "share": [4 / 5, 3 / 5, 0.0],
            "share_eligible": [1.0, 3 / 4, 0.0],
            "prompt_tokens": [50, 50, 50],
            "prompt_tokens_eligible": [47, 47, 17],
            "prompt_tokens_sharing": [47, 30, 0],
            "token_share": [47 / 50, 30 / 50, 0.0],
            "token_share_eligible": [1.0, 30 / 47, 0.0],
        }
    )
    assert_frame_equal(got, want)


def test_curve_ignores_unknown_hashes_and_handles_short_prompts() -> None:
    rows = [
        {"t": 0, "prompt": 3, "h": []},
        {"t": 1, "prompt": 2, "h": []},
        {"t": 2, "prompt": 900, "h": [], "known": False, "pb": 0},
    ]
    curve = sharing_curve(_frame(rows), B)
    assert curve["window_tokens"].to_list() == [4]
    assert curve.row(0, named=True)["requests"] == 2
    assert curve.row(0, named=True)["eligible"] == 0
    assert curve.row(0, named=True)["share"] == 0.0
    assert curve.row(0, named=True)["share_eligible"] is None
    shape = classify_curve(curve, 2.5)
    assert shape["shape"] == "unknown"


def test_reuse_hand_computed() -> None:
    per = reuse_per_request(_frame(HAND), B, (60.0, 600.0, 3600.0))
    want = pl.DataFrame(
        {
            "row": [0, 1, 2, 3, 4],
            "hashes_known": [True] * 5,
            "prompt_tokens": [10, 8, 17, 3, 12],
            "prompt_blocks": [2, 2, 4, 0, 3],
            # Hit limit ⌊(P - 1) / 4⌋ blocks: r1 (8 tokens) 1, r2 (17) 4, r4 (12) 2.
            # r1: A, AB hit but the prompt is exactly 2 blocks: the last token is recomputed and
            # hits are whole blocks -> 1 block = 4. r2: A only -> 4. r4: A, AB and r0's OUTPUT
            # block ABC -> 3 blocks, limited to 2 = 8.
            "hit_blocks": [0, 2, 1, 0, 3],
            "hit_tokens": [0, 4, 4, 0, 8],
            # r1's blocks last seen 30 s ago (r0); r2's A last seen 70 s ago (r1); r4's A 900 s
            # (r2), AB 970 s (r1), ABC 1000 s (r0).
            "hit_tokens_within_60s": [0, 4, 0, 0, 0],
            "hit_tokens_within_600s": [0, 4, 4, 0, 0],
            "hit_tokens_within_3600s": [0, 4, 4, 0, 8],
            "last_seen_age_s": [None, 30.0, 70.0, None, 1000.0],
            # same tenant: r1 (y) saw A/AB only from x -> 0; r2 (x) A from r0 -> 4; r4 (y) A, AB
            # from r1 (y) but ABC only from x -> 2 blocks = 8.
            "hit_tokens_same_tenant": [0, 0, 4, 0, 8],
        },
        schema_overrides={"prompt_blocks": pl.Int64, "row": pl.Int64},
    )
    assert_frame_equal(per, want, check_dtypes=False)
    summary = reuse_summary(per, (60.0, 600.0, 3600.0))
    assert summary["hit_tokens"] == 16
    assert summary["hit_share"] == pytest.approx(16 / 50)
    assert summary["block_hit_share"] == pytest.approx(6 / 11)
    assert summary["requests_with_hit"] == 3
    assert [b["hit_tokens"] for b in summary["by_retention"]] == [4, 8, 16, 16]
    assert [b["hit_tokens"] for b in summary["age_bins"]] == [4, 4, 8, 0]
    # same tenant 4 + 8 = 12 of 16
    assert summary["cross_tenant"]["hit_tokens_cross_tenant"] == 4
    # Hits by deepest age: r1 4 tokens at 30 s, r2 4 at 70 s, r4 8 at 1000 s (of 16):
    # 4 + 4 = 8 is exactly half, so 70 s serves 50 %; 90 % and 99 % need 1000 s.
    assert summary["retention_needed_s"] == {"p50": 70.0, "p90": 1000.0, "p99": 1000.0}
    assert summary["cross_tenant"]["cross_tenant_share_of_hits"] == pytest.approx(4 / 16)


def test_reuse_without_tenants_and_with_unknown_hashes() -> None:
    rows = [dict(r, tenant=None) for r in HAND]
    rows.insert(2, {"t": 50, "prompt": 40, "h": [A, AB, 99], "known": False, "pb": 0})
    per = reuse_per_request(_frame(rows), B)
    # The unknown-hash request neither hits nor feeds the cache.
    assert per["hit_tokens"].to_list() == [0, 4, 0, 4, 0, 8]
    assert per["hit_tokens_same_tenant"].null_count() == per.height
    summary = reuse_summary(per, (60.0, 600.0, 3600.0))
    assert summary["cross_tenant"] is None
    assert summary["prompt_tokens"] == 50  # the count-only request's 40 tokens are left out
    assert summary["requests"] == 5


def test_single_request_and_zero_prompt() -> None:
    per = reuse_per_request(_frame([{"t": 0, "prompt": 0, "h": []}]), B)
    assert per["hit_tokens"].to_list() == [0]
    per = reuse_per_request(_frame([{"t": 0, "prompt": 9, "h": [A, AB]}]), B)
    assert per["hit_blocks"].to_list() == [0]


def test_coarser_block_size_by_striding() -> None:
    frame, size = at_block_size(_frame(HAND), 8)
    assert size == 8
    assert frame["prefix_hashes"].to_list()[2] == [AD, ADEF]
    assert frame["prompt_blocks"].to_list() == [1, 1, 2, 0, 1]
    curve = sharing_curve(frame, 8)
    assert curve["window_tokens"].to_list() == [8, 16]
    assert curve["sharing"].to_list() == [3, 0]
    with pytest.raises(PrefixInputError, match="not a multiple"):
        at_block_size(_frame(HAND), 6)


def test_mixed_block_sizes_rejected() -> None:
    frame = _frame(HAND).with_columns(
        pl.when(pl.col("request_id") == "r0")
        .then(8)
        .otherwise(4)
        .cast(pl.Int32)
        .alias("block_size")
    )
    with pytest.raises(PrefixInputError, match="several block sizes"):
        analyse(frame, DEFAULTS.prefix)


def _curve(points: dict[int, float]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "window_tokens": list(points),
            "eligible": [10] * len(points),
            "share_eligible": list(points.values()),
        }
    )


def test_classification_thresholds() -> None:
    falls = _curve({16: 0.9, 256: 0.9, 1024: 0.3, 4096: 0.1, 8192: 0.05})
    got = classify_curve(falls, 10_000)
    assert (got["shape"], got["short_window_tokens"], got["long_window_tokens"]) == (
        "short system prompt",
        256,
        4096,
    )
    assert got["retention"] == pytest.approx(0.1 / 0.9)
    stays = _curve({16: 0.9, 256: 0.8, 1024: 0.7, 4096: 0.6})
    assert classify_curve(stays, 10_000)["shape"] == "long shared context"
    # The long window is capped at the median prompt (1500 -> 1024).
    capped = classify_curve(falls, 1500)
    assert capped["long_window_tokens"] == 1024
    assert capped["shape"] == "short system prompt"
    none = _curve({16: 0.3, 256: 0.1, 4096: 0.1})
    assert classify_curve(none, 10_000)["shape"] == "no sharing"
    short_prompts = classify_curve(_curve({16: 0.9, 256: 0.9}), 200)
    assert short_prompts["shape"] == "short system prompt"
    assert short_prompts["long_window_tokens"] is None


def _random_trace(seed: int, n: int, block_size: int) -> list[dict[str, object]]:
    """Conversations that extend earlier turns (prompt + output), shared system prompts and
    unique prompts; hashes are a real chain (the whole prefix tuple mapped to an int)."""
    rng = random.Random(seed)
    ids: dict[tuple[int, ...], int] = {}
    systems = [[rng.randrange(50) for _ in range(rng.randrange(1, 12))] for _ in range(3)]
    convs: list[list[int]] = []
    rows = []
    t = 0.0
    for _ in range(n):
        t += rng.expovariate(1 / 40)
        u = rng.random()
        if convs and u < 0.5:
            conv = rng.choice(convs)
            conv.extend(rng.randrange(50) for _ in range(rng.randrange(0, 10)))
            prompt = list(conv)
        else:
            prompt = list(rng.choice(systems)) + [
                rng.randrange(50) for _ in range(rng.randrange(9))
            ]
            convs.append(prompt)
        output = [rng.randrange(50) for _ in range(rng.randrange(0, 9))]
        if convs and prompt is not None and rng.random() < 0.7:
            for conv in convs:
                if conv == prompt:
                    conv.extend(output)
                    break
        tokens = prompt + output
        n_blocks = len(tokens) // block_size
        chain = [
            ids.setdefault(tuple(tokens[: (k + 1) * block_size]), len(ids)) for k in range(n_blocks)
        ]
        rows.append(
            {
                "t": t,
                "prompt": len(prompt),
                "output": len(output),
                "h": chain,
                "tenant": rng.choice(["a", "b", "c"]),
                "tokens": tokens,
            }
        )
    return rows


def _reference(rows: list[dict[str, object]], block_size: int) -> dict[str, list[object]]:
    """Straightforward replay: walk each prompt's blocks from the start until the first block no
    earlier request held; look up when (and by which tenant) each block was last held."""
    last_seen: dict[int, float] = {}
    seen_by: dict[tuple[str, int], bool] = {}
    hit_tokens, within_60, same, share_w = [], [], [], []
    for row in rows:
        chain: list[int] = row["h"]  # type: ignore[assignment]
        prompt = int(row["prompt"])  # type: ignore[call-overload]
        pb = prompt // block_size
        k = k60 = ks = 0
        for j in range(pb):
            if chain[j] not in last_seen:
                break
            k += 1
        for j in range(pb):
            if chain[j] not in last_seen or float(row["t"]) - last_seen[chain[j]] > 60:  # type: ignore[arg-type]
                break
            k60 += 1
        for j in range(pb):
            if (str(row["tenant"]), chain[j]) not in seen_by:
                break
            ks += 1
        limit = max(prompt - 1, 0) // block_size  # whole blocks, last token recomputed
        hit_tokens.append(min(k, limit) * block_size)
        within_60.append(min(k60, limit) * block_size)
        same.append(min(ks, limit) * block_size)
        for h in chain:
            last_seen[h] = float(row["t"])  # type: ignore[arg-type]
            seen_by[(str(row["tenant"]), h)] = True
    # Curve at W = 2B straight from the tokens: does another request share the first W tokens?
    w = 2 * block_size
    firsts = [tuple(r["tokens"][:w]) for r in rows if int(r["prompt"]) >= w]  # type: ignore[index,call-overload]
    for row in rows:
        head = tuple(row["tokens"][:w])  # type: ignore[index]
        share_w.append(int(row["prompt"]) >= w and firsts.count(head) > 1)  # type: ignore[call-overload]
    return {"hit_tokens": hit_tokens, "within_60": within_60, "same": same, "share_2b": share_w}


@pytest.mark.parametrize("seed", range(5))
def test_matches_reference_on_random_conversations(seed: int) -> None:
    rows = _random_trace(seed, 200, B)
    frame = _frame([{k: v for k, v in r.items() if k != "tokens"} for r in rows])
    want = _reference(rows, B)
    per = reuse_per_request(frame, B, (60.0,))
    assert per["hit_tokens"].to_list() == want["hit_tokens"]
    assert per["hit_tokens_within_60s"].to_list() == want["within_60"]
    assert per["hit_tokens_same_tenant"].to_list() == want["same"]
    curve = sharing_curve(frame, B)
    at_2b = curve.filter(pl.col("window_tokens") == 2 * B).row(0, named=True)
    assert at_2b["sharing"] == sum(want["share_2b"])  # type: ignore[arg-type]


def test_analyse_summary_keys() -> None:
    result = analyse(_frame(HAND), DEFAULTS.prefix)
    summary = result.summary
    assert summary.block_size == B
    assert summary.requests == 5
    assert summary.reuse.hit_tokens == 16
    assert summary.sessions.inferred is True
    # r1 continues r0 and r4 continues r1 (latest of the equal matches r0, r1); r2, r3 start anew.
    assert result.sessions.collect()["session_id"].to_list() == [
        "inferred-0",
        "inferred-0",
        "inferred-1",
        "inferred-2",
        "inferred-0",
    ]
    assert summary.sessions.sessions == 3
    assert summary.sessions.turns_max == 3


def test_count_only_trace_has_no_curve() -> None:
    rows = [
        {"t": 0, "prompt": 40, "h": [], "known": False},
        {"t": 1, "prompt": 9, "h": [], "known": False},
    ]
    result = analyse(_frame(rows), DEFAULTS.prefix)
    assert result.curve.height == 0
    assert result.summary.block_size is None
    assert result.summary.classification.shape == "unknown"
    assert result.summary.reuse.hit_share is None
    assert result.sessions.collect()["session_id"].to_list() == ["inferred-0", "inferred-1"]
    assert curve_svg(result.curve).startswith(b"<?xml")


def test_shared_prefix_ratio_reads_the_share_per_window() -> None:
    """The benchmark join takes the ratio of docs/decision-rules.md#prefix-sharing (share of all
    requests) per window."""
    result = analyse(_frame(HAND), DEFAULTS.prefix)
    curve = result.curve.filter(pl.col("share").is_not_null())
    assert curve.height > 0
    assert result.shared_prefix_ratio() == dict(
        zip(curve["window_tokens"].to_list(), curve["share"].to_list(), strict=True)
    )
    count_only = analyse(_frame([{"t": 0, "prompt": 40, "h": [], "known": False}]), DEFAULTS.prefix)
    assert count_only.shared_prefix_ratio() == {}
