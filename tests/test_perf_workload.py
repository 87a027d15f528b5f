"""The benchmarks' generated workload (``perf/workload.py``) and the plain-Python shape baseline
(``perf/shape_baseline.py``): deterministic, ingestible, shaped as documented, and agreeing
with the stages they stand beside."""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from perf.shape_baseline import disagreements, read_requests, shape_metrics, stage_figures
from perf.workload import (
    MOONCAKE_BLOCK_TOKENS,
    Conversations,
    MooncakeIds,
    canonical_frame,
    conversations,
    count,
    main,
    spec,
    write_csv,
    write_mooncake,
    write_mooncake_streamed,
    write_token_ids,
)
from pipeline.config import default_config
from pipeline.ingest.compute import ingest_paths
from pipeline.shape.compute import compute_shape

REQUESTS = 3_000


@pytest.fixture(scope="module")
def drawn() -> Conversations:
    return conversations(spec(REQUESTS, seed=11))


@pytest.fixture(scope="module")
def hash_form(tmp_path_factory: pytest.TempPathFactory, drawn: Conversations) -> Path:
    path = tmp_path_factory.mktemp("hash") / "trace.jsonl"
    write_mooncake(drawn, path)
    return path


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path, hash_form: Path) -> None:
    """Drawing again from the same seed writes a byte-identical file; another seed does not."""
    again, other = tmp_path / "again.jsonl", tmp_path / "other.jsonl"
    write_mooncake(conversations(spec(REQUESTS, seed=11)), again)
    write_mooncake(conversations(spec(REQUESTS, seed=12)), other)
    assert again.read_bytes() == hash_form.read_bytes()
    assert other.read_bytes() != hash_form.read_bytes()


def test_hash_form_lines_are_json_dumps_in_arrival_order(
    hash_form: Path, drawn: Conversations
) -> None:
    """Every line is what json.dumps writes for the record, in arrival order, with
    ⌈input_length / 512⌉ ids; the sizes are realistic (mean prompt in the thousands)."""
    lines = hash_form.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [json.dumps(r) for r in records] == lines
    stamps = [r["timestamp"] for r in records]
    assert stamps == sorted(stamps) and stamps[0] == 0
    assert all(len(r["hash_ids"]) == -(-r["input_length"] // 512) for r in records)
    prompts = np.array([r["input_length"] for r in records])
    assert 2_000 < prompts.mean() < 8_000 and prompts.max() <= 32_768
    assert sorted(prompts.tolist()) == sorted(drawn.prompt.tolist())


@pytest.mark.parametrize(
    "settings",
    [
        {},  # today's one round of 100,000 conversations
        {"conversation_chunk": 97},  # dozens of rounds: requests wait across round boundaries
        {"conversation_chunk": 300, "diurnal": 0.6, "rate_rps": 0.02},  # a daily cycle, days
    ],
)
def test_streamed_hash_form_is_the_one_shot_bytes(tmp_path: Path, settings: dict[str, Any]) -> None:
    """Writing the hash form a round of conversations at a time gives the bytes and the
    summary of drawing the whole trace first."""
    chosen = spec(REQUESTS, seed=11, **settings)
    whole, streamed = tmp_path / "whole.jsonl", tmp_path / "streamed.jsonl"
    expected = write_mooncake(conversations(chosen), whole)
    got = write_mooncake_streamed(chosen, streamed)
    assert streamed.read_bytes() == whole.read_bytes()
    assert got.written == expected.__class__(**{**expected.__dict__, "path": streamed})
    drawn = conversations(chosen)
    assert got.conversations == drawn.n_conversations
    assert got.span_us == int(drawn.arrival_us.max()) - int(drawn.arrival_us.min())


def test_span_days_spreads_the_sessions_over_that_many_days(tmp_path: Path) -> None:
    """``--span-days 91`` sets the rate so the trace covers about a quarter; without it the
    command writes what the default rate gives (the bytes of today's traces)."""
    quarter, default = tmp_path / "quarter.jsonl", tmp_path / "default.jsonl"
    main(["--requests", "2000", "--out", str(quarter), "--span-days", "91"])
    main(["--requests", "2000", "--out", str(default)])
    last = json.loads(quarter.read_text().splitlines()[-1])["timestamp"] / 86_400_000
    assert 85 < last < 97
    write_mooncake(conversations(spec(2000)), tmp_path / "expected.jsonl")
    assert default.read_bytes() == (tmp_path / "expected.jsonl").read_bytes()


def test_a_generation_stopped_half_way_leaves_no_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace is written beside its name and renamed when whole: stopped half way (here, an
    error after the first bytes), neither the name nor the part written stays, so a later
    ``perf.e2e --traces`` cannot take it for a finished trace."""
    target = tmp_path / "trace.jsonl"

    def stopped(chosen: Any, path: Path) -> Any:
        path.write_text('{"timestamp": 0}\n')
        raise KeyboardInterrupt

    monkeypatch.setattr("perf.workload.write_mooncake_streamed", stopped)
    with pytest.raises(KeyboardInterrupt):
        main(["--requests", "2000", "--out", str(target)])
    assert list(tmp_path.iterdir()) == []


def test_hash_form_ingests_cleanly(hash_form: Path, drawn: Conversations) -> None:
    """The project's reader takes the hash form as Mooncake: every request, none quarantined,
    the lengths as drawn."""
    result = ingest_paths([hash_form], salt=b"test")
    assert result.summary.files[0].format == "mooncake"
    assert result.summary.ingested == REQUESTS
    assert result.summary.quarantined == 0
    assert result.requests["prompt_tokens"].to_list() == drawn.prompt[drawn.order].tolist()


def test_each_turn_extends_its_predecessors_chain(drawn: Conversations) -> None:
    """Turn k+1's full-block ids start with all of turn k's full-block ids (its prompt holds
    turn k's prompt and answer and a new message); a partial last block's id is the request's
    own; the distinct full blocks are as the summary counts them."""
    layout = MooncakeIds.of(drawn)
    rows = np.arange(drawn.n)
    offsets, ids = layout.ids(drawn, rows)
    full = drawn.prompt // MOONCAKE_BLOCK_TOKENS
    chains = [ids[offsets[i] : offsets[i] + full[i]].tolist() for i in range(drawn.n)]
    multi = np.flatnonzero(drawn.turn > 0)
    assert multi.size > REQUESTS // 2
    for i in multi.tolist():
        assert drawn.conv[i - 1] == drawn.conv[i]
        previous, this = chains[i - 1], chains[i]
        assert this[: len(previous)] == previous
        assert drawn.prompt[i] > drawn.prompt[i - 1] + drawn.output[i - 1]  # history + message
    # A partial last block's id belongs to that request alone.
    partial = [ids[offsets[i + 1] - 1] for i in range(drawn.n) if drawn.prompt[i] % 512]
    assert len(set(partial)) == len(partial)
    assert not set(partial) & {b for chain in chains for b in chain}
    # Distinct full blocks as the summary counts them.
    assert layout.distinct(drawn)[0] == len({b for chain in chains for b in chain})


def test_token_form_describes_the_same_conversations(tmp_path: Path) -> None:
    """The token-id form of a draw has the hash form's lengths request by request, carries
    tenants, models and sessions when asked, ingests through the token-ids reader, and its
    turns share their predecessors' chained blocks."""
    small = conversations(spec(300, "short", seed=5, tenants=3, models=2))
    tokens, hashed = tmp_path / "tokens.jsonl", tmp_path / "hash.jsonl"
    write_token_ids(small, tokens, sessions=True)
    records = [json.loads(line) for line in tokens.read_text().splitlines()]
    assert {r["tenant"] for r in records} == {"tenant-0", "tenant-1", "tenant-2"}
    assert {r["model"] for r in records} == {"model-0", "model-1"}
    with pytest.raises(ValueError, match="tenant or model"):
        write_mooncake(small, hashed)
    write_mooncake(conversations(spec(300, "short", seed=5)), hashed)
    hash_records = [json.loads(line) for line in hashed.read_text().splitlines()]
    assert [len(r["prompt_token_ids"]) for r in records] == [
        r["input_length"] for r in hash_records
    ]
    assert [len(r["output_token_ids"]) for r in records] == [
        r["output_length"] for r in hash_records
    ]
    # Within a session, turn k+1's prompt is turn k's prompt + answer + a new message.
    by_session: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_session.setdefault(r["session_id"], []).append(r)
    checked = 0
    for turns in by_session.values():
        for a, b in itertools.pairwise(turns):
            history = a["prompt_token_ids"] + a["output_token_ids"]
            assert b["prompt_token_ids"][: len(history)] == history
            checked += 1
    assert checked > 100
    result = ingest_paths([tokens], salt=b"test")
    assert result.summary.files[0].format == "token-ids"
    assert (result.summary.ingested, result.summary.quarantined) == (300, 0)
    frame = result.requests
    assert frame["tenant"].n_unique() == 3 and frame["session_id"].n_unique() > 50
    # The reader's chains and the generator's canonical frame share blocks alike: same number
    # of blocks per request and the same number of distinct blocks.
    ours = canonical_frame(small, 16, sessions=True)
    assert frame["prefix_hashes"].list.len().to_list() == ours["prefix_hashes"].list.len().to_list()
    assert frame["prefix_hashes"].explode().n_unique() == ours["prefix_hashes"].explode().n_unique()


def test_canonical_frame_options(drawn: Conversations) -> None:
    """The canonical frame logs tenants, models and sessions when asked, and leaves the
    answers' blocks out of the chain on request."""
    frame = canonical_frame(conversations(spec(500, "short", tenants=4, models=2)), 16)
    assert frame["tenant"].n_unique() == 4 and frame["model"].n_unique() == 2
    assert frame["session_id"].null_count() == 500
    with_answers = canonical_frame(drawn, 64, sessions=True)
    prompts_only = canonical_frame(drawn, 64, answers_in_chain=False)
    assert with_answers["session_id"].n_unique() == drawn.n_conversations
    assert prompts_only["prefix_hashes"].list.len().to_list() == (
        (drawn.prompt[drawn.order] // 64).tolist()
    )
    assert (
        with_answers["prefix_hashes"].list.len() > prompts_only["prefix_hashes"].list.len()
    ).any()


def test_size_shorthands() -> None:
    assert [count(t) for t in ("100K", "1M", "10M", "2500")] == [
        100_000,
        1_000_000,
        10_000_000,
        2_500,
    ]
    for wrong in ("abc", "0", "-1K", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="is not a request count"):
            count(wrong)


def test_shape_baseline_agrees_with_the_stage(tmp_path: Path) -> None:
    """The plain-Python figures equal the shape stage's on a generated trace with sessions,
    tenants, models and a daily cycle (and a wrong figure would be reported)."""
    drawn = conversations(spec(4_000, seed=3, tenants=5, models=2, diurnal=0.5, rate_rps=5.0))
    path = tmp_path / "requests.csv"
    write_csv(drawn, path)
    cfg = default_config().shape
    stage = stage_figures(compute_shape(canonical_frame(drawn, None, sessions=True), cfg).to_json())
    lm = cfg.latency
    ours = shape_metrics(
        read_requests(path), (lm.ttft_base_ms, lm.ttft_per_prompt_token_ms, lm.tpot_ms)
    )
    assert len(ours) == 33
    assert disagreements(ours, stage) == []
    assert ours["sessions"] == drawn.n_conversations and ours["tenants"] == 5
    assert disagreements({**ours, "prompt_tokens_p99": ours["prompt_tokens_p99"] + 1}, stage)


def test_csv_export_matches_the_frame(tmp_path: Path) -> None:
    """The CSV export holds the canonical frame's arrivals and lengths, row for row."""
    drawn = conversations(spec(200, "short", seed=1))
    path = tmp_path / "r.csv"
    write_csv(drawn, path)
    csv = pl.read_csv(path)
    frame = canonical_frame(drawn, None, sessions=True)
    assert csv["arrival_us"].to_list() == frame["arrival"].dt.epoch("us").to_list()
    assert csv["prompt_tokens"].to_list() == frame["prompt_tokens"].to_list()
