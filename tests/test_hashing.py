"""Chained, salted block hashes: prefix identity, salting, partial blocks, striding."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from pipeline.hashing import chain_hash_block_ids, chain_hash_tokens, salt_fingerprint
from pipeline.ingest.tokenize import ApproximateTokenizer

SALT = b"s"


def test_shared_prefix_shares_exactly_its_full_blocks() -> None:
    """Two sequences agreeing on their first 40 tokens share the first 2 blocks of 16, not the 3rd."""
    rng = np.random.default_rng(0)
    common = rng.integers(0, 50_000, 40)
    a = np.concatenate([common, rng.integers(0, 50_000, 30)])
    b = np.concatenate([common, rng.integers(50_000, 60_000, 30)])
    ha, hb = chain_hash_tokens(a, 16, SALT), chain_hash_tokens(b, 16, SALT)
    assert len(ha) == 70 // 16 == 4
    assert list(ha[:2]) == list(hb[:2])
    assert ha[2] != hb[2] and ha[3] != hb[3]


def test_block_hash_depends_on_the_whole_prefix() -> None:
    """Equal block content after a different prefix gets a different hash (it is a chain)."""
    block = list(range(16))
    a = chain_hash_tokens([1] * 16 + block, 16, SALT)
    b = chain_hash_tokens([2] * 16 + block, 16, SALT)
    assert a[1] != b[1]


def test_partial_tail_is_not_hashed_and_salt_changes_everything() -> None:
    """Only full blocks are hashed; another salt gives unrelated hashes."""
    tokens = list(range(47))
    assert len(chain_hash_tokens(tokens, 16, SALT)) == 2
    assert len(chain_hash_tokens(tokens[:15], 16, SALT)) == 0
    other = chain_hash_tokens(tokens, 16, b"other")
    assert set(other.tolist()).isdisjoint(chain_hash_tokens(tokens, 16, SALT).tolist())
    assert salt_fingerprint(SALT) != salt_fingerprint(b"other")


def test_invalid_token_ids_are_rejected() -> None:
    with pytest.raises(ValueError, match="token ids"):
        chain_hash_tokens([-1] * 16, 16, SALT)
    with pytest.raises(ValueError, match="token ids"):
        chain_hash_tokens([2**32] * 16, 16, SALT)


def test_coarser_blocks_by_striding_identify_the_same_prefixes() -> None:
    """Striding the 16-chain every 4th hash answers "same first 64k tokens?" exactly like the tokens do."""
    rng = np.random.default_rng(1)
    base = rng.integers(0, 1000, 400)
    sequences = [base.copy() for _ in range(6)]
    for i, cut in enumerate([0, 63, 64, 130, 256, 400]):  # diverge at different token offsets
        sequences[i][cut:] = rng.integers(1000, 2000, 400 - cut)
    frame = pl.DataFrame(
        {"h": [chain_hash_tokens(s, 16, SALT).tolist() for s in sequences]},
        schema={"h": pl.List(pl.UInt64)},
    )
    coarse = frame.select(pl.col("h").list.gather_every(4, offset=3))["h"].to_list()
    for i in range(6):
        for j in range(6):
            for k in range(400 // 64):
                same_tokens = bool(
                    np.array_equal(sequences[i][: 64 * (k + 1)], sequences[j][: 64 * (k + 1)])
                )
                assert (coarse[i][k] == coarse[j][k]) == same_tokens


def test_block_id_chain_remaps_ids_into_prefix_hashes() -> None:
    """Source block ids become chained hashes: equal id prefixes ⇔ equal hashes."""
    a = chain_hash_block_ids([0, 1, 2], SALT)
    b = chain_hash_block_ids([0, 1, 3], SALT)
    c = chain_hash_block_ids([5, 1, 2], SALT)
    assert a[0] == b[0] and a[1] == b[1] and a[2] != b[2]
    assert c[1] != a[1] and c[2] != a[2]
    # ids and token content live in different domains
    assert chain_hash_block_ids([0], SALT)[0] != chain_hash_tokens([0] * 16, 16, SALT)[0]


def test_approximate_tokenizer_is_deterministic_and_plausible() -> None:
    """Same text, same ids; English prose lands near the usual ~4 characters per token."""
    text = "The quick brown fox jumps over the lazy dog, again and again, 12345 times." * 10
    tok = ApproximateTokenizer()
    ids = tok.encode(text)
    assert ids == ApproximateTokenizer().encode(text)
    assert 2.5 <= len(text) / len(ids) <= 6
    assert tok.approximate
