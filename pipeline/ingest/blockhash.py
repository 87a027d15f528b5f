"""Chained block-id hashes for many requests at once: keyed BLAKE2b-64 compiled with numba.

:func:`pipeline.hashing.chain_hash_block_ids` hashes one request's source block ids with
``hashlib``, one Python call per block (about a microsecond each). A trace such as Mooncake's
carries tens of millions of block ids, so readers hash them here instead: the ids of a whole
batch of requests as one flat array with per-request offsets, the chains of up to
:data:`_GROUP` requests side by side in one compiled loop the compiler vectorises (several
lanes of hashes per instruction), producing exactly the hashes ``hashlib`` produces. It runs on
one thread: no threading layer (whose OpenMP flavour does not survive a fork), and a
machine's other core is left to whatever else runs.

The construction is the one :mod:`pipeline.hashing` documents: block ``k``'s hash is
``BLAKE2b(key=salt, digest_size=8; b"\\x02" || hash(block k-1) || id as 8 signed
little-endian bytes)``, the parent of block 0 being eight zero bytes, and the 8-byte digest read
as a little-endian integer. The 17-byte message fits one BLAKE2b block, so each hash is one
compression after the key block, whose state is computed once per salt (as ``hashlib``'s
``copy()`` of the keyed state does).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numba as nb
import numpy as np
import numpy.typing as npt

# BLAKE2b's initialisation vector and message schedule (RFC 7693).
IV = (
    0x6A09E667F3BCC908,
    0xBB67AE8584CAA73B,
    0x3C6EF372FE94F82B,
    0xA54FF53A5F1D36F1,
    0x510E527FADE682D1,
    0x9B05688C2B3E6C1F,
    0x1F83D9ABFB41BD6B,
    0x5BE0CD19137E2179,
)
SIGMA = (
    (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
    (14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3),
    (11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4),
    (7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8),
    (9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13),
    (2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9),
    (12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11),
    (13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10),
    (6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5),
    (10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0),
)
ROUNDS = 12
BLOCK_BYTES = 128
DIGEST_BYTES = 8
BLOCK_ID_DOMAIN = 0x02  # pipeline.hashing's domain byte for source block ids
MESSAGE_BYTES = 17  # domain byte, parent hash, block id
_MASK = (1 << 64) - 1

# ---------------------------------------------------------------------------------------------
# The key block, once per salt: plain Python integers (one compression, no need for speed).


def _rotr_int(x: int, n: int) -> int:
    return ((x >> n) | (x << (64 - n))) & _MASK


def compress_words(h: list[int], m: list[int], counter: int, last: bool) -> list[int]:
    """BLAKE2b's compression function F on Python integers (RFC 7693, 3.2)."""
    v = [*h, *IV]
    v[12] ^= counter & _MASK
    v[13] ^= counter >> 64
    if last:
        v[14] ^= _MASK
    for r in range(ROUNDS):
        s = SIGMA[r % 10]
        for i, (a, b, c, d) in enumerate(
            ((0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15),
             (0, 5, 10, 15), (1, 6, 11, 12), (2, 7, 8, 13), (3, 4, 9, 14))
        ):  # fmt: skip
            x, y = m[s[2 * i]], m[s[2 * i + 1]]
            v[a] = (v[a] + v[b] + x) & _MASK
            v[d] = _rotr_int(v[d] ^ v[a], 32)
            v[c] = (v[c] + v[d]) & _MASK
            v[b] = _rotr_int(v[b] ^ v[c], 24)
            v[a] = (v[a] + v[b] + y) & _MASK
            v[d] = _rotr_int(v[d] ^ v[a], 16)
            v[c] = (v[c] + v[d]) & _MASK
            v[b] = _rotr_int(v[b] ^ v[c], 63)
    return [h[i] ^ v[i] ^ v[i + 8] for i in range(8)]


def _key(salt: bytes) -> bytes:
    # As pipeline.hashing._keyed: BLAKE2b keys are at most 64 bytes, longer salts are folded.
    return salt if len(salt) <= 64 else hashlib.blake2b(salt).digest()


def keyed_state(
    salt: bytes, message_bytes: int = MESSAGE_BYTES
) -> tuple[npt.NDArray[np.uint64], int]:
    """BLAKE2b-64's state for ``salt`` once the key block is compressed, and the byte counter
    at the end of a ``message_bytes`` message after it (without a key there is no key block)."""
    key = _key(salt)
    h = list(IV)
    h[0] ^= 0x01010000 | (len(key) << 8) | DIGEST_BYTES
    counter = message_bytes
    if key:
        block = key.ljust(BLOCK_BYTES, b"\0")
        words = [int.from_bytes(block[i : i + 8], "little") for i in range(0, BLOCK_BYTES, 8)]
        h = compress_words(h, words, BLOCK_BYTES, False)
        counter += BLOCK_BYTES
    return np.array(h, dtype=np.uint64), counter


# ---------------------------------------------------------------------------------------------
# The chain kernel. The state lives in tuples of scalars, so the compiler keeps it in registers;
# the message's 13 always-zero words are spelled ``z`` in each round's schedule (SIGMA, with
# only the positions of words 0-2 kept), so no work is spent on them.


@nb.njit(cache=True)
def _rotr(x: np.uint64, n: int) -> np.uint64:
    return (x >> np.uint64(n)) | (x << np.uint64(64 - n))


@nb.njit(cache=True)
def _mix(a: Any, b: Any, c: Any, d: Any, x: Any, y: Any) -> tuple[Any, Any, Any, Any]:
    a = a + b + x
    d = _rotr(d ^ a, 32)
    c = c + d
    b = _rotr(b ^ c, 24)
    a = a + b + y
    d = _rotr(d ^ a, 16)
    c = c + d
    b = _rotr(b ^ c, 63)
    return a, b, c, d


@nb.njit(cache=True)
def _round(
    v: Any, x0: Any, x1: Any, x2: Any, x3: Any, x4: Any, x5: Any, x6: Any, x7: Any,
    x8: Any, x9: Any, x10: Any, x11: Any, x12: Any, x13: Any, x14: Any, x15: Any,
) -> Any:  # fmt: skip
    """One round on the 16-word working state ``v``, message words in schedule order."""
    v0, v4, v8, v12 = _mix(v[0], v[4], v[8], v[12], x0, x1)
    v1, v5, v9, v13 = _mix(v[1], v[5], v[9], v[13], x2, x3)
    v2, v6, v10, v14 = _mix(v[2], v[6], v[10], v[14], x4, x5)
    v3, v7, v11, v15 = _mix(v[3], v[7], v[11], v[15], x6, x7)
    v0, v5, v10, v15 = _mix(v0, v5, v10, v15, x8, x9)
    v1, v6, v11, v12 = _mix(v1, v6, v11, v12, x10, x11)
    v2, v7, v8, v13 = _mix(v2, v7, v8, v13, x12, x13)
    v3, v4, v9, v14 = _mix(v3, v4, v9, v14, x14, x15)
    return (v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15)


# Inlined where it is called, so the loop in _digests is a plain loop the compiler vectorises
# (several lanes of hashes per instruction: about four times the speed of one at a time).
@nb.njit(cache=True, inline="always")
def _final_digest(h: Any, counter: Any, m0: Any, m1: Any, m2: Any) -> np.uint64:
    """The first state word after the final compression of a message whose words 3-15 are 0."""
    z = np.uint64(0)
    v = (
        h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7],
        np.uint64(IV[0]), np.uint64(IV[1]), np.uint64(IV[2]), np.uint64(IV[3]),
        np.uint64(IV[4]) ^ counter, np.uint64(IV[5]), ~np.uint64(IV[6]), np.uint64(IV[7]),
    )  # fmt: skip
    v = _round(v, m0, m1, m2, z, z, z, z, z, z, z, z, z, z, z, z, z)
    v = _round(v, z, z, z, z, z, z, z, z, m1, z, m0, m2, z, z, z, z)
    v = _round(v, z, z, z, m0, z, m2, z, z, z, z, z, z, z, m1, z, z)
    v = _round(v, z, z, z, m1, z, z, z, z, m2, z, z, z, z, m0, z, z)
    v = _round(v, z, m0, z, z, m2, z, z, z, z, m1, z, z, z, z, z, z)
    v = _round(v, m2, z, z, z, m0, z, z, z, z, z, z, z, z, z, m1, z)
    v = _round(v, z, z, m1, z, z, z, z, z, m0, z, z, z, z, m2, z, z)
    v = _round(v, z, z, z, z, z, m1, z, z, z, m0, z, z, z, z, m2, z)
    v = _round(v, z, z, z, z, z, z, m0, z, z, m2, z, z, m1, z, z, z)
    v = _round(v, z, m2, z, z, z, z, m1, z, z, z, z, z, z, z, z, m0)
    v = _round(v, m0, m1, m2, z, z, z, z, z, z, z, z, z, z, z, z, z)
    v = _round(v, z, z, z, z, z, z, z, z, m1, z, m0, m2, z, z, z, z)
    return h[0] ^ v[0] ^ v[8]  # type: ignore[no-any-return]


@nb.njit(cache=True)
def _digests(
    state: Any,
    counter: np.uint64,
    parents: npt.NDArray[np.uint64],
    block_ids: npt.NDArray[np.uint64],
    out: npt.NDArray[np.uint64],
    n: int,
) -> None:
    """``out[i]`` = the hash of block ``block_ids[i]`` after ``parents[i]``, for ``i < n``."""
    domain = np.uint64(BLOCK_ID_DOMAIN)
    for i in range(n):
        parent, block_id = parents[i], block_ids[i]
        # The message 0x02 || parent || id, both 8 bytes little-endian, as 64-bit words.
        out[i] = _final_digest(
            state,
            counter,
            domain | (parent << np.uint64(8)),
            (parent >> np.uint64(56)) | (block_id << np.uint64(8)),
            block_id >> np.uint64(56),
        )


# Requests hashed side by side: a group's chains advance block position by block position (its
# parents, ids and digests stay in the first-level cache).
_GROUP = 2048


@nb.njit(cache=True)
def _chain_kernel(
    ids: npt.NDArray[np.int64],
    starts: npt.NDArray[np.int64],
    counts: npt.NDArray[np.int64],
    out_offsets: npt.NDArray[np.int64],
    h: npt.NDArray[np.uint64],
    counter: np.uint64,
    out: npt.NDArray[np.uint64],
) -> None:
    """Every run's chain; the runs come longest first, so at block position ``k`` the runs
    still going are a prefix of each group's."""
    state = (h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7])
    n = counts.size
    parents = np.empty(_GROUP, np.uint64)
    block_ids = np.empty(_GROUP, np.uint64)
    digests = np.empty(_GROUP, np.uint64)
    for lo in range(0, n, _GROUP):
        width = min(n, lo + _GROUP) - lo
        parents[:width] = 0
        active = width
        for k in range(counts[lo]):
            while counts[lo + active - 1] <= k:
                active -= 1
            for i in range(active):
                block_ids[i] = np.uint64(ids[starts[lo + i] + k])
            _digests(state, counter, parents, block_ids, digests, active)
            for i in range(active):
                parents[i] = digests[i]
                out[out_offsets[lo + i] + k] = digests[i]


def chain_hash_id_runs(
    ids: npt.NDArray[np.int64],
    starts: npt.NDArray[np.int64],
    counts: npt.NDArray[np.int64],
    salt: bytes,
) -> npt.NDArray[np.uint64]:
    """Chained hashes of many requests' block ids: request ``r``'s chain runs over
    ``ids[starts[r] : starts[r] + counts[r]]``. Returns every chain's hashes concatenated in
    request order (``counts.sum()`` values), each equal to
    :func:`pipeline.hashing.chain_hash_block_ids` of that run."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    counts = np.ascontiguousarray(counts, dtype=np.int64)
    if starts.shape != counts.shape:
        raise ValueError("starts and counts differ in length")
    if counts.size and (counts.min() < 0 or starts.min() < 0 or (starts + counts).max() > ids.size):
        raise ValueError("a run lies outside the ids")
    out_offsets = np.zeros(counts.size, dtype=np.int64)
    np.cumsum(counts[:-1], out=out_offsets[1:])
    out = np.empty(int(counts.sum()), dtype=np.uint64)
    state, counter = keyed_state(salt)
    longest_first = np.argsort(-counts, kind="stable")
    _chain_kernel(
        ids,
        starts[longest_first],
        counts[longest_first],
        out_offsets[longest_first],
        state,
        np.uint64(counter),
        out,
    )
    return out


# ---------------------------------------------------------------------------------------------
# Token-id chains: the message of block k is b"\x01" || hash(block k-1) || its block_size ids
# as 4-byte little-endian words (pipeline.hashing.chain_hash_tokens), so 9 + 4 × block_size
# bytes: one BLAKE2b block up to 29 tokens, more above (a general compression, all 16 words).

TOKENS_DOMAIN = 0x01  # pipeline.hashing's domain byte for token ids
_SIGMA = np.array(SIGMA, dtype=np.int64)


@nb.njit(cache=True)
def _compress(
    h: npt.NDArray[np.uint64],
    m: npt.NDArray[np.uint64],
    counter: np.uint64,
    last: bool,
) -> None:
    """BLAKE2b's compression F of the 16 words ``m`` into the state ``h``, in place."""
    v = (
        h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7],
        np.uint64(IV[0]), np.uint64(IV[1]), np.uint64(IV[2]), np.uint64(IV[3]),
        np.uint64(IV[4]) ^ counter, np.uint64(IV[5]),
        ~np.uint64(IV[6]) if last else np.uint64(IV[6]), np.uint64(IV[7]),
    )  # fmt: skip
    for r in range(ROUNDS):
        s = _SIGMA[r % 10]
        v = _round(
            v, m[s[0]], m[s[1]], m[s[2]], m[s[3]], m[s[4]], m[s[5]], m[s[6]], m[s[7]],
            m[s[8]], m[s[9]], m[s[10]], m[s[11]], m[s[12]], m[s[13]], m[s[14]], m[s[15]],
        )  # fmt: skip
    for i in range(8):
        h[i] ^= v[i] ^ v[i + 8]


@nb.njit(cache=True)
def _token_chain_kernel(
    ids: npt.NDArray[np.uint32],
    runs: npt.NDArray[np.int64],
    counts: npt.NDArray[np.int64],
    block_size: int,
    state: npt.NDArray[np.uint64],
    key_bytes: int,
    out: npt.NDArray[np.uint64],
) -> None:
    """Request ``r``'s sequence is ``ids[runs[r, 0] : +runs[r, 1]]`` then
    ``ids[runs[r, 2] : +runs[r, 3]]``; its ``counts[r]`` full blocks are hashed into ``out``
    one after another."""
    message = 9 + 4 * block_size
    chunks = (message + BLOCK_BYTES - 1) // BLOCK_BYTES
    buf = np.zeros(chunks * BLOCK_BYTES, dtype=np.uint8)  # the padding stays zero
    words = buf.view(np.uint64)
    h = np.empty(8, dtype=np.uint64)
    buf[0] = TOKENS_DOMAIN
    o = 0
    for r in range(counts.size):
        first_start, first_count, second_start = runs[r, 0], runs[r, 1], runs[r, 2]
        parent = np.uint64(0)
        for k in range(counts[r]):
            for b in range(8):
                buf[1 + b] = (parent >> np.uint64(8 * b)) & np.uint64(0xFF)
            base = k * block_size
            for j in range(block_size):
                t = base + j
                token = (
                    ids[first_start + t] if t < first_count else ids[second_start + t - first_count]
                )
                at = 9 + 4 * j
                buf[at] = token & 0xFF
                buf[at + 1] = (token >> 8) & 0xFF
                buf[at + 2] = (token >> 16) & 0xFF
                buf[at + 3] = token >> 24
            h[:] = state
            for c in range(chunks):
                last = c == chunks - 1
                done = message if last else (c + 1) * BLOCK_BYTES
                _compress(h, words[16 * c : 16 * c + 16], np.uint64(key_bytes + done), last)
            parent = h[0]
            out[o] = parent
            o += 1


# One-block token messages (up to 29 tokens: 9 + 4 × 29 = 125 bytes) are hashed
# for a group of requests side by side, as block ids are: the loop over the group's lanes is a
# plain loop the compiler vectorises.
ONE_BLOCK_TOKENS = (BLOCK_BYTES - 9) // 4


@nb.njit(cache=True, inline="always")
def _one_block_digest(
    h: Any, counter: Any, m0: Any, m1: Any, m2: Any, m3: Any, m4: Any, m5: Any, m6: Any, m7: Any, m8: Any, m9: Any, m10: Any, m11: Any, m12: Any, m13: Any, m14: Any, m15: Any,
) -> np.uint64:  # fmt: skip
    """The first state word after the final compression of a one-block message ``m``."""
    v = (
        h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7],
        np.uint64(IV[0]), np.uint64(IV[1]), np.uint64(IV[2]), np.uint64(IV[3]),
        np.uint64(IV[4]) ^ counter, np.uint64(IV[5]), ~np.uint64(IV[6]), np.uint64(IV[7]),
    )  # fmt: skip
    v = _round(v, m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15)  # fmt: skip
    v = _round(v, m14, m10, m4, m8, m9, m15, m13, m6, m1, m12, m0, m2, m11, m7, m5, m3)  # fmt: skip
    v = _round(v, m11, m8, m12, m0, m5, m2, m15, m13, m10, m14, m3, m6, m7, m1, m9, m4)  # fmt: skip
    v = _round(v, m7, m9, m3, m1, m13, m12, m11, m14, m2, m6, m5, m10, m4, m0, m15, m8)  # fmt: skip
    v = _round(v, m9, m0, m5, m7, m2, m4, m10, m15, m14, m1, m11, m12, m6, m8, m3, m13)  # fmt: skip
    v = _round(v, m2, m12, m6, m10, m0, m11, m8, m3, m4, m13, m7, m5, m15, m14, m1, m9)  # fmt: skip
    v = _round(v, m12, m5, m1, m15, m14, m13, m4, m10, m0, m7, m6, m3, m9, m2, m8, m11)  # fmt: skip
    v = _round(v, m13, m11, m7, m14, m12, m1, m3, m9, m5, m0, m15, m4, m8, m6, m2, m10)  # fmt: skip
    v = _round(v, m6, m15, m14, m9, m11, m3, m0, m8, m12, m2, m13, m7, m1, m4, m10, m5)  # fmt: skip
    v = _round(v, m10, m2, m8, m4, m7, m6, m1, m5, m15, m11, m9, m14, m3, m12, m13, m0)  # fmt: skip
    v = _round(v, m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15)  # fmt: skip
    v = _round(v, m14, m10, m4, m8, m9, m15, m13, m6, m1, m12, m0, m2, m11, m7, m5, m3)  # fmt: skip
    return h[0] ^ v[0] ^ v[8]  # type: ignore[no-any-return]


@nb.njit(cache=True)
def _one_block_digests(
    state: Any, counter: np.uint64, m: npt.NDArray[np.uint64], out: npt.NDArray[np.uint64], n: int
) -> None:
    """``out[i]`` = the digest of the one-block message ``m[:, i]``, for ``i < n``."""
    for i in range(n):
        out[i] = _one_block_digest(
            state, counter, m[0, i], m[1, i], m[2, i], m[3, i], m[4, i], m[5, i], m[6, i],
            m[7, i], m[8, i], m[9, i], m[10, i], m[11, i], m[12, i], m[13, i], m[14, i], m[15, i],
        )  # fmt: skip


@nb.njit(cache=True)
def _token_lanes_kernel(
    ids: npt.NDArray[np.uint32],
    runs: npt.NDArray[np.int64],
    counts: npt.NDArray[np.int64],
    out_offsets: npt.NDArray[np.int64],
    block_size: int,
    h: npt.NDArray[np.uint64],
    counter: np.uint64,
    out: npt.NDArray[np.uint64],
) -> None:
    """:func:`_token_chain_kernel` for one-block messages, :data:`_GROUP` requests side by
    side (the runs come longest first, as in :func:`_chain_kernel`)."""
    state = (h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7])
    n = counts.size
    m = np.zeros((16, _GROUP), np.uint64)
    message = np.zeros(BLOCK_BYTES, np.uint8)
    words = message.view(np.uint64)
    message[0] = TOKENS_DOMAIN
    parents = np.empty(_GROUP, np.uint64)
    digests = np.empty(_GROUP, np.uint64)
    for lo in range(0, n, _GROUP):
        width = min(n, lo + _GROUP) - lo
        parents[:width] = 0
        active = width
        for k in range(counts[lo] if width else 0):
            while counts[lo + active - 1] <= k:
                active -= 1
            for i in range(active):
                r = lo + i
                first_start, first_count, second_start = runs[r, 0], runs[r, 1], runs[r, 2]
                parent = parents[i]
                for b in range(8):
                    message[1 + b] = (parent >> np.uint64(8 * b)) & np.uint64(0xFF)
                base = k * block_size
                for j in range(block_size):
                    t = base + j
                    token = (
                        ids[first_start + t]
                        if t < first_count
                        else ids[second_start + t - first_count]
                    )
                    at = 9 + 4 * j
                    message[at] = token & 0xFF
                    message[at + 1] = (token >> 8) & 0xFF
                    message[at + 2] = (token >> 16) & 0xFF
                    message[at + 3] = token >> 24
                for w in range(16):
                    m[w, i] = words[w]
            _one_block_digests(state, counter, m, digests, active)
            for i in range(active):
                parents[i] = digests[i]
                out[out_offsets[lo + i] + k] = digests[i]


def chain_hash_token_runs(
    ids: npt.NDArray[np.uint32],
    runs: npt.NDArray[np.int64],
    block_size: int,
    salt: bytes,
) -> npt.NDArray[np.uint64]:
    """Chained token-id hashes of many requests at once: request ``r``'s tokens are
    ``ids[runs[r, 0] : runs[r, 0] + runs[r, 1]]`` followed by ``ids[runs[r, 2] : runs[r, 2] +
    runs[r, 3]]`` (its prompt and its output, say). Returns every request's chain over its full
    ``block_size``-token blocks, concatenated in request order, each equal to
    :func:`pipeline.hashing.chain_hash_tokens` of that request's tokens."""
    ids = np.ascontiguousarray(ids, dtype=np.uint32)
    runs = np.ascontiguousarray(runs, dtype=np.int64).reshape(-1, 4)
    if block_size < 1:
        raise ValueError("block_size must be positive")
    starts, lengths = runs[:, 0::2], runs[:, 1::2]
    if runs.size and (starts.min() < 0 or lengths.min() < 0 or (starts + lengths).max() > ids.size):
        raise ValueError("a run lies outside the ids")
    counts = lengths.sum(axis=1) // block_size
    out = np.empty(int(counts.sum()), dtype=np.uint64)
    message = 9 + 4 * block_size
    state, counter = keyed_state(salt, message)
    if block_size > ONE_BLOCK_TOKENS:
        _token_chain_kernel(ids, runs, counts, block_size, state, counter - message, out)
        return out
    out_offsets = np.zeros(counts.size, dtype=np.int64)
    np.cumsum(counts[:-1], out=out_offsets[1:])
    longest_first = np.argsort(-counts, kind="stable")
    _token_lanes_kernel(
        ids,
        runs[longest_first],
        counts[longest_first],
        out_offsets[longest_first],
        block_size,
        state,
        np.uint64(counter),
        out,
    )
    return out
