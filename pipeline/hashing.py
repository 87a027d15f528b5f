"""Salted, chained 64-bit block hashes: the only trace of prompt content enginefit keeps.

Block ``k``'s hash is ``BLAKE2b-64(key=salt; hash(block k-1) || payload of block k)``, so one
hash identifies the whole prefix up to and including block ``k`` — the key vLLM's automatic
prefix caching uses. Keying BLAKE2b with a secret salt means a hash cannot be matched against
a dictionary of hashes of common prompts without the salt.

Two payload kinds share the chain construction but never collide (a domain byte differs):
token ids (text and token-id traces) and source block ids (traces such as Mooncake that ship
their own per-block ids instead of content).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import numpy.typing as npt

# The salt of the bundled sample configuration (enginefit.yaml): public, so it protects nothing;
# ingest warns when it salts the hashes of any trace but the bundled samples.
SAMPLE_SALT = b"enginefit-bundled-sample-salt"
_TOKENS = b"\x01"
_BLOCK_ID = b"\x02"
_ROOT_PARENT = bytes(8)


def _keyed(salt: bytes) -> hashlib.blake2b:
    # BLAKE2b keys are at most 64 bytes; longer salts are folded first so any salt works.
    key = salt if len(salt) <= 64 else hashlib.blake2b(salt).digest()
    return hashlib.blake2b(key=key, digest_size=8)


def chain_hash_tokens(
    tokens: Sequence[int] | npt.NDArray[np.integer], block_size: int, salt: bytes
) -> npt.NDArray[np.uint64]:
    """Chained hashes of the full ``block_size``-token blocks of ``tokens`` (a partial tail is dropped)."""
    ids = np.asarray(tokens, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() > 0xFFFFFFFF):
        raise ValueError("token ids must be in [0, 2**32)")
    n_blocks = ids.size // block_size
    raw = ids[: n_blocks * block_size].astype("<u4").tobytes()
    step = 4 * block_size
    base = _keyed(salt)
    out = np.empty(n_blocks, dtype=np.uint64)
    parent = _ROOT_PARENT
    for k in range(n_blocks):
        h = base.copy()
        h.update(_TOKENS + parent + raw[k * step : (k + 1) * step])
        parent = h.digest()
        out[k] = int.from_bytes(parent, "little")
    return out


def chain_hash_block_ids(block_ids: Sequence[int], salt: bytes) -> npt.NDArray[np.uint64]:
    """Chained hashes over a source's own per-block ids, remapping them into our hash space.

    Chaining makes the result prefix-identifying even if the source's ids were per-block only.
    """
    base = _keyed(salt)
    out = np.empty(len(block_ids), dtype=np.uint64)
    parent = _ROOT_PARENT
    for k, block_id in enumerate(block_ids):
        h = base.copy()
        h.update(_BLOCK_ID + parent + int(block_id).to_bytes(8, "little", signed=True))
        parent = h.digest()
        out[k] = int.from_bytes(parent, "little")
    return out


# The fingerprint's key derivation, fixed so a fingerprint stays comparable across versions:
# scrypt (RFC 7914) with N=2^15, r=8, p=1 (32 MiB and about 0.1-0.3 s per salt), a fixed
# domain salt, 6 bytes out. Slow on purpose: confirming a guessed salt against a printed
# fingerprint costs that much per guess, where the former unkeyed hash cost nanoseconds.
FINGERPRINT_SCRYPT_N, FINGERPRINT_SCRYPT_R, FINGERPRINT_SCRYPT_P = 2**15, 8, 1
FINGERPRINT_BYTES = 6
FINGERPRINT_DOMAIN = b"enginefit-salt-fingerprint-v2"
_SCRYPT_MAXMEM = 64 * 1024 * 1024


@lru_cache(maxsize=8)
def salt_fingerprint(salt: bytes) -> str:
    """A short tag of the salt, safe to print: scrypt with the fixed parameters above."""
    derived = hashlib.scrypt(
        salt,
        salt=FINGERPRINT_DOMAIN,
        n=FINGERPRINT_SCRYPT_N,
        r=FINGERPRINT_SCRYPT_R,
        p=FINGERPRINT_SCRYPT_P,
        maxmem=_SCRYPT_MAXMEM,
        dklen=FINGERPRINT_BYTES,
    )
    return derived.hex()
