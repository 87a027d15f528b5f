"""The compiled block-id chain hash gives exactly what ``hashlib`` gives, for every salt."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.blockhash import BLOCK_BYTES, DIGEST_BYTES, IV, chain_hash_id_runs, compress_words
from pipeline.hashing import chain_hash_block_ids

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
