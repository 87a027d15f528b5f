"""Ingestion of the real public traces, checked against independent readings of the same files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pipeline.ingest.compute import ingest_paths
from tests.conftest import REPO, shared_if_present, shared_path

SALT = b"test-salt"
BUNDLED_MOONCAKE = REPO / "traces" / "mooncake" / "conversation_trace.jsonl"
BUNDLED_AZURE = REPO / "traces" / "azure-code" / "AzureLLMInferenceTrace_code.csv"


@pytest.mark.parametrize(
    "path",
    [BUNDLED_MOONCAKE, *shared_if_present("traces", "mooncake-fast25", "conversation_trace.jsonl")],
    ids=lambda p: p.parent.name,
)
def test_mooncake_conversation_trace(path: Path) -> None:
    """All 12,031 rows ingest; lengths, arrivals and full-block hashes match the raw JSON."""
    result = ingest_paths([path], salt=SALT)
    raw = [json.loads(line) for line in path.read_text().splitlines()]
    req = result.requests
    assert result.summary.records_read == len(raw) == 12_031
    assert result.summary.ingested == 12_031 and result.summary.quarantined == 0
    assert req["block_size"].unique().to_list() == [512]
    # SOURCE.md: input p50 6,909, output max 2,000, span 3,537 s
    assert req["prompt_tokens"].median() == 6_909
    assert req["output_tokens"].max() == 2_000
    assert result.summary.span_s == pytest.approx(3_536.999)
    # The file is sorted, and arrival = anchor + timestamp ms (stable sort keeps file order).
    assert req["source_line"].to_list() == list(range(1, 12_032))
    offsets_ms = (req["arrival"] - req["arrival"][0]).dt.total_milliseconds().to_list()
    assert offsets_ms == [r["timestamp"] for r in raw]
    # Only full 512-token blocks are kept: 12,009 rows have a partial last block.
    expected_blocks = [r["input_length"] // 512 for r in raw]
    assert req["prompt_blocks"].to_list() == expected_blocks
    assert req["prefix_hashes"].list.len().to_list() == expected_blocks
    # Hash equality ⇔ equal id prefixes (checked independently with tuples of the raw ids).
    seen: dict[tuple[int, ...], int] = {}
    for row, hashes in zip(raw, req["prefix_hashes"].to_list(), strict=True):
        for k, h in enumerate(hashes):
            key = tuple(row["hash_ids"][: k + 1])
            assert seen.setdefault(key, h) == h
    assert len(set(seen.values())) == len(seen)
    # The shared first block (every request starts with id 0) is one hash.
    first = req.filter(pl.col("prompt_blocks") > 0)["prefix_hashes"].list.first()
    assert first.n_unique() == 1
    assert result.summary.duplicate_timestamps == 12_031 - 1_180  # ~3 s quantisation


@pytest.mark.parametrize(
    "path",
    [
        BUNDLED_AZURE,
        *shared_if_present("traces", "azure-llm-2023", "AzureLLMInferenceTrace_code.csv"),
    ],
    ids=lambda p: p.parent.name,
)
def test_azure_code_trace(path: Path) -> None:
    """8,819 rows; counts, percentiles and span agree with numpy over the raw CSV."""
    result = ingest_paths([path], salt=SALT)
    req = result.requests
    assert result.summary.ingested == 8_819 and result.summary.quarantined == 0
    lines = path.read_text().splitlines()[1:]
    context = np.array([int(line.split(",")[1]) for line in lines])
    generated = np.array([int(line.split(",")[2]) for line in lines])
    assert req["prompt_tokens"].to_numpy().tolist() == context.tolist()
    assert req["output_tokens"].to_numpy().tolist() == generated.tolist()
    assert np.percentile(context, 50, method="inverted_cdf") == 1_469  # SOURCE.md
    assert req["prompt_tokens"].max() == 7_437
    assert result.summary.span_s == pytest.approx(3_435.948056)
    assert str(req["arrival"][0]) == "2023-11-16 18:17:03.979960+00:00"
    assert not req["hashes_known"].any()
    assert req["request_id"][0] == f"{path}:2"  # header is line 1


def test_bundled_copies_are_byte_identical_to_shared() -> None:
    """The NOTICE'd copies under traces/ are the public files, unmodified."""
    for bundled, shared in [
        (BUNDLED_MOONCAKE, ("traces", "mooncake-fast25", "conversation_trace.jsonl")),
        (BUNDLED_AZURE, ("traces", "azure-llm-2023", "AzureLLMInferenceTrace_code.csv")),
    ]:
        assert bundled.read_bytes() == shared_path(*shared, bundled_ok=False).read_bytes()
