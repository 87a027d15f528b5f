"""The prefix stage in bounded memory: with the default budgets a small trace gives the bytes the
stage gave before it streamed every per-request array (hashes taken from that code); with
lowered budgets the sampled curve and reuse replay land within their stated standard errors of
the exact path and say so in the result; the sampled replay's kernel counts what an independent
reference counts; a table past the in-memory limit has its sessions written as they come, the
same rows."""

from __future__ import annotations

import gc
import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from perf.workload import canonical_frame, conversations, spec
from pipeline.layout import WorkloadLayout
from pipeline.prefix import analysis, stage
from pipeline.prefix.analysis import analyse
from pipeline.prefix.hashmap import splitmix64
from pipeline.prefix.present import estimate_note, summary_text
from pipeline.prefix.replay import HELD, USES, Replay, rate_threshold
from pipeline.prefix.result import PrefixResult
from pipeline.prefix.sessions import flat_lists
from pipeline.store import json_bytes
from tests.conftest import DEFAULTS
from tests.prefix_oracles import reuse_per_request

# The code before the stage streamed its per-request arrays (commit c378398), on the trace
# below with the default settings: sha256 of the summary's JSON and of the curve and sessions
# as CSV.
BEFORE = {
    "summary": "7980edb54b78e78421fd3ff2adf3337fd053c3016d7b4257adbbc2863871f1d9",
    "curve": "bef1fe895ae8f86a098a2579447a8f823288e3af7427f9064c813d57e86c8c7e",
    "sessions": "29e6fd72371320d04f596f4fa17f146ccf58ea5ddcca54656080c0d04fb625e3",
}


@pytest.fixture(scope="module")
def trace() -> pl.DataFrame:
    """3,000 generated requests at 16-token blocks, three tenants, two models."""
    return canonical_frame(conversations(spec(3_000, "short", seed=7, tenants=3, models=2)), 16)


def _digests(result: PrefixResult) -> dict[str, str]:
    return {
        name: hashlib.sha256(data).hexdigest()
        for name, data in (
            ("summary", json_bytes(result.to_json())),
            ("curve", result.curve.write_csv().encode()),
            ("sessions", result.sessions.collect().write_csv().encode()),
        )
    }


def test_default_budgets_give_the_outputs_of_before(trace: pl.DataFrame) -> None:
    result = analyse(trace, DEFAULTS.prefix)
    assert result.summary.estimate is None
    assert "estimate" not in result.to_json()
    assert _digests(result) == BEFORE
    assert estimate_note(result.summary) is None


def _salted(trace: pl.DataFrame, salt: int) -> pl.DataFrame:
    """The same trace with every hash XORed with ``salt``: the same sharing, another sample."""
    return trace.with_columns(
        pl.col("prefix_hashes").list.eval(pl.element() ^ pl.lit(salt, pl.UInt64))
    )


LOW = {"curve_hash_budget": 17_000, "reuse_block_budget": 16_000, "session_state_budget": 300}


def test_lowered_budgets_estimate_within_their_stated_errors(trace: pl.DataFrame) -> None:
    exact = analyse(trace, DEFAULTS.prefix).summary
    z: dict[str, list[float]] = {"hit": [], "block": [], "isolated": []}
    for salt in range(1, 13):
        salted = _salted(trace, salt * 0x9E3779B97F4A7C15 % 2**64)
        got = analyse(salted, DEFAULTS.prefix.replace(**LOW)).summary
        estimate = got.estimate
        assert estimate is not None and estimate.reuse is not None and estimate.curve is not None
        assert estimate.reuse.shared is not None and 0 < estimate.reuse.shared.rate < 0.5
        assert estimate.reuse.shared.blocks_kept <= LOW["reuse_block_budget"] * 1.5
        assert estimate.sessions is not None and estimate.sessions.closed_early > 0
        assert estimate.retention_needed is not None
        assert estimate.retention_needed.basis == "blocks"
        # what is not estimated is exact
        assert (got.requests, got.reuse.prompt_tokens, got.reuse.prompt_blocks) == (
            exact.requests,
            exact.reuse.prompt_tokens,
            exact.reuse.prompt_blocks,
        )
        assert [p.eligible for p in got.curve] == [p.eligible for p in exact.curve]
        errors = estimate.reuse
        assert got.reuse.hit_share is not None and exact.reuse.hit_share is not None
        assert errors.hit_share_standard_error and errors.block_hit_share_standard_error
        z["hit"].append(
            (got.reuse.hit_share - exact.reuse.hit_share) / errors.hit_share_standard_error
        )
        z["block"].append((got.reuse.block_hit_share or 0) - (exact.reuse.block_hit_share or 0))
        z["block"][-1] /= errors.block_hit_share_standard_error
        assert got.reuse.cross_tenant is not None and exact.reuse.cross_tenant is not None
        isolated = errors.isolated_hit_share_standard_error
        assert isolated
        z["isolated"].append(
            (
                (got.reuse.cross_tenant.isolated_hit_share or 0)
                - (exact.reuse.cross_tenant.isolated_hit_share or 0)
            )
            / isolated
        )
        note = estimate_note(got)
        assert note is not None and "spatial sample of cache blocks" in note
        assert note.count(".") >= 2 and "±" in note
    for name, scores in z.items():
        scores_array = np.array(scores)
        # each estimate within 4 standard errors, and the errors neither far too small nor
        # far too large over the twelve samples (the curve's estimate has its own test in
        # test_prefix_chunked)
        assert np.abs(scores_array).max() < 4, (name, scores)
        assert 0.1 < float(np.mean(scores_array**2)) < 4, (name, scores)


def test_the_sampled_kernel_counts_what_a_reference_counts(trace: pl.DataFrame) -> None:
    """Kept prompt-block uses and the held ones among them, against the exact per-request hits
    (a request's held blocks are its leading ones) and each hash's splitmix64."""
    one_model = trace.with_columns(pl.lit(None, pl.String).alias("model"))
    per = reuse_per_request(one_model, 16)
    rate = 0.3
    replay = Replay(40, np.zeros(0), with_age=True, rate=rate)
    flat = flat_lists(one_model["prefix_hashes"])
    known = one_model["hashes_known"].to_numpy().astype(np.bool_)
    blocks = per["prompt_blocks"].to_numpy().astype(np.int32)
    limit = np.maximum(one_model["prompt_tokens"].to_numpy() - 1, 0) // 16
    us = one_model["arrival"].dt.epoch("us").to_numpy()
    replay.feed_sampled(
        flat.offsets, flat.values, blocks, limit, known, us - us[0], np.zeros(0, np.int64)
    )
    threshold = int(rate_threshold(rate))
    uses = held = 0
    for i, hit in enumerate(per["hit_blocks"].to_list()):
        chain = flat.values[flat.offsets[i] : flat.offsets[i] + blocks[i]]
        kept = [int(splitmix64(np.uint64(h))) < threshold for h in chain]
        uses += sum(kept)
        held += sum(kept[:hit])
    assert uses > 1000
    assert replay.sums[:, USES].sum() == pytest.approx(uses / rate)
    assert replay.sums[:, HELD].sum() == pytest.approx(held / rate)


def test_the_sampled_replay_halves_its_rate_to_stay_in_budget(trace: pl.DataFrame) -> None:
    flat = flat_lists(trace["prefix_hashes"])
    known = trace["hashes_known"].to_numpy().astype(np.bool_)
    blocks = trace["prompt_blocks"].to_numpy().astype(np.int32)
    limit = np.maximum(trace["prompt_tokens"].to_numpy() - 1, 0) // 16
    us = trace["arrival"].dt.epoch("us").to_numpy() - int(trace["arrival"].dt.epoch("us")[0])
    replay = Replay(40, np.zeros(0), with_age=False, budget=500, rate=0.5)
    rates = []
    for lo in range(0, trace.height, 300):
        hi = min(lo + 300, trace.height)
        offsets = flat.offsets[lo : hi + 1] - flat.offsets[lo]
        values = flat.values[flat.offsets[lo] : flat.offsets[hi]]
        replay.feed_sampled(
            offsets, values, blocks[lo:hi], limit[lo:hi], known[lo:hi], us[lo:hi], np.zeros(0)
        )
        assert replay.table.keys() <= 500
        rates.append(replay.rate)
    assert rates[-1] <= 0.5 / 4 and rates == sorted(rates, reverse=True)


def test_sessions_past_the_in_memory_limit_are_written_as_they_come(
    trace: pl.DataFrame, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_memory = analyse(trace, DEFAULTS.prefix)
    monkeypatch.setattr(analysis, "SESSIONS_IN_MEMORY_MAX", 1_000)
    monkeypatch.setattr(analysis, "CHUNK_HASHES", 20_000)
    layout = WorkloadLayout(tmp_path / "out")
    result = stage.run(stage.inputs_from(trace, layout), DEFAULTS.prefix)
    spilled = list(layout.prefix.dir.glob(".sessions.parquet.*"))
    assert len(spilled) == 1  # beside the file it becomes, named as a temporary
    stage.write(result, layout)
    assert result.to_json() == in_memory.to_json()
    written = stage.read_result(layout)
    assert_frame_equal(written.sessions.collect(), in_memory.sessions.collect())
    del result
    gc.collect()
    assert not list(layout.prefix.dir.glob(".sessions.parquet.*"))


def test_the_terminal_says_what_is_estimated(trace: pl.DataFrame) -> None:
    got = analyse(trace, DEFAULTS.prefix.replace(**LOW)).summary
    text = summary_text(got)
    assert "spatial sample of its prefix hashes" in text
    assert "closed early by session_state_budget 300" in text
    dumped: dict[str, Any] = PrefixResult(got, pl.DataFrame(), pl.LazyFrame()).to_json()
    assert set(dumped["estimate"]) == {"curve", "reuse", "retention_needed", "sessions"}
