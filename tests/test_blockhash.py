"""The compiled block-id and token-id chain hashes give exactly what ``hashlib`` gives, for
every salt and block size."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.hashing import chain_hash_block_ids, chain_hash_tokens
from pipeline.ingest.blockhash import (
    BLOCK_BYTES,
    DIGEST_BYTES,
    IV,
    chain_hash_id_runs,
    chain_hash_token_runs,
    compress_words,
)

INT64 = st.integers(-(2**63), 2**63 - 1)
SALTS = [b"", b"s", b"enginefit-bundled-sample-salt", b"k" * 64, b"long" * 40, bytes(range(256))]


def reference(ids: np.ndarray, starts: list[int], counts: list[int], salt: bytes) -> list[int]:
    return [
        int(h)
        for start, count in zip(starts, counts, strict=True)
        for h in chain_hash_block_ids(ids[start : start + count].tolist(), salt)
    ]


@pytest.mark.parametrize("salt", SALTS, ids=lambda s: f"{len(s)}-byte salt")
def test_runs_hash_like_hashlib_for_every_salt_length(salt: bytes) -> None:
    """Keys up to 64 bytes, the empty key (no key block) and folded long salts; ids across
    the whole signed 64-bit range; empty, overlapping and single-id runs."""
    rng = np.random.default_rng(len(salt))
    ids = np.concatenate(
        [
            np.array([0, -1, 1, -(2**63), 2**63 - 1, 255, 256, -256], dtype=np.int64),
            rng.integers(-(2**63), 2**63 - 1, 300, dtype=np.int64),
        ]
    )
    starts, counts = [0, 0, 5, 8, 8, 100, 307], [8, 0, 30, 1, 300, 7, 1]
    got = chain_hash_id_runs(ids, np.array(starts), np.array(counts), salt)
    assert got.dtype == np.uint64
    assert got.tolist() == reference(ids, starts, counts, salt)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.lists(INT64, max_size=12), max_size=8), st.binary(max_size=80))
def test_any_runs_any_salt(runs: list[list[int]], salt: bytes) -> None:
    ids = np.array([i for run in runs for i in run], dtype=np.int64)
    counts = [len(run) for run in runs]
    starts = np.cumsum([0, *counts[:-1]]).tolist() if runs else []
    got = chain_hash_id_runs(ids, np.array(starts, dtype=np.int64), np.array(counts), salt)
    assert got.tolist() == reference(ids, starts, counts, salt)


def test_a_run_outside_the_ids_is_refused() -> None:
    ids = np.arange(10, dtype=np.int64)
    with pytest.raises(ValueError, match="outside"):
        chain_hash_id_runs(ids, np.array([5]), np.array([6]), b"s")
    with pytest.raises(ValueError, match="outside"):
        chain_hash_id_runs(ids, np.array([-1]), np.array([1]), b"s")
    with pytest.raises(ValueError, match="differ"):
        chain_hash_id_runs(ids, np.array([0, 1]), np.array([1]), b"s")
    assert chain_hash_id_runs(ids, np.array([], dtype=np.int64), np.array([]), b"s").size == 0


def test_the_compression_function_is_blake2b() -> None:
    """The integer compression (used for the key block) reproduces an unkeyed BLAKE2b-64 of a
    one-block message, the digest being the first state word."""
    message = bytes(range(100))
    h = list(IV)
    h[0] ^= 0x01010000 | DIGEST_BYTES
    block = message.ljust(BLOCK_BYTES, b"\0")
    words = [int.from_bytes(block[i : i + 8], "little") for i in range(0, BLOCK_BYTES, 8)]
    digest = compress_words(h, words, len(message), True)[0]
    expected = hashlib.blake2b(message, digest_size=DIGEST_BYTES).digest()
    assert digest == int.from_bytes(expected, "little")


def token_reference(
    ids: np.ndarray, runs: list[list[int]], block_size: int, salt: bytes
) -> list[int]:
    return [
        int(h)
        for a, b, c, d in runs
        for h in chain_hash_tokens(
            np.concatenate([ids[a : a + b], ids[c : c + d]]).astype(np.int64), block_size, salt
        )
    ]


@pytest.mark.parametrize("salt", SALTS, ids=lambda s: f"{len(s)}-byte salt")
@pytest.mark.parametrize("block_size", [1, 2, 16, 29, 30, 31, 61, 64, 200])
def test_token_runs_hash_like_hashlib(salt: bytes, block_size: int) -> None:
    """Messages of one BLAKE2b block (up to 29 tokens: 9 + 4 × 29 = 125 bytes) and of several;
    ids across [0, 2**32); requests of two runs (prompt then output) that are empty, shorter
    than a block, overlapping or out of order in the ids."""
    rng = np.random.default_rng(block_size)
    ids = np.concatenate(
        [
            np.array([0, 1, 255, 256, 2**31, 2**32 - 1], dtype=np.uint32),
            rng.integers(0, 2**32, 2000, dtype=np.uint64).astype(np.uint32),
        ]
    )
    runs = [
        [0, 500, 600, 123],
        [0, 0, 0, 0],
        [7, block_size - 1, 0, 0],
        [1000, 0, 3, 2 * block_size + 1],
        [1500, 400, 100, 400],
        [10, block_size, 10 + block_size, block_size],
    ]
    got = chain_hash_token_runs(ids, np.array(runs), block_size, salt)
    assert got.dtype == np.uint64
    assert got.tolist() == token_reference(ids, runs, block_size, salt)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    st.lists(st.lists(st.integers(0, 2**32 - 1), max_size=70), min_size=1, max_size=8),
    st.integers(1, 40),
    st.binary(max_size=80),
)
def test_any_token_runs_any_salt(runs: list[list[int]], block_size: int, salt: bytes) -> None:
    """Each drawn list split in two runs at its middle, the second run stored first."""
    ids, spans = [], []
    for run in runs:
        half = len(run) // 2
        second = len(ids)
        ids += run[half:]
        first = len(ids)
        ids += run[:half]
        spans.append([first, half, second, len(run) - half])
    array = np.array(ids, dtype=np.uint32)
    got = chain_hash_token_runs(array, np.array(spans, dtype=np.int64), block_size, salt)
    assert got.tolist() == token_reference(array, spans, block_size, salt)


def test_token_runs_outside_the_ids_are_refused() -> None:
    ids = np.arange(10, dtype=np.uint32)
    with pytest.raises(ValueError, match="outside"):
        chain_hash_token_runs(ids, np.array([[5, 6, 0, 0]]), 4, b"s")
    with pytest.raises(ValueError, match="outside"):
        chain_hash_token_runs(ids, np.array([[0, 1, -1, 1]]), 4, b"s")
    with pytest.raises(ValueError, match="positive"):
        chain_hash_token_runs(ids, np.array([[0, 1, 0, 0]]), 0, b"s")
    assert chain_hash_token_runs(ids, np.zeros((0, 4), dtype=np.int64), 4, b"s").size == 0
