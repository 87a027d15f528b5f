"""The unbounded prefix-cache replay behind the prefix stage's reuse potential, streamed:
requests arrive in chunks (in arrival order) and only the table of distinct blocks stays in
memory.

One pass in arrival order with a packed open-addressing table (numba, ``pipeline.prefix.hashmap``)
from (block hash, group) to the most recent row that held it. The group keeps caches apart
exactly: the shared replay's group is the request's (model, LoRA adapter) namespace; the
same-tenant replay's is its (namespace, tenant), which gives what replaying each tenant's
requests alone would, in one pass and the same kind of table (the stage runs it in a second pass
over the chains, after the shared table is gone). The table is in 64 parts
that grow one at a time, so growing never holds two copies of it. Memory is the tables (23-34
bytes per distinct (block, group), ``pipeline.prefix.hashmap``) plus a few numbers per request,
whatever the number of blocks.

A vectorised version (explode every block, stable sort by hash, previous holder = previous
row) gives the same answer but sorts every block and holds the whole table; this pass is linear
in the blocks (docs/prefix.md, "Memory: out of core", has the measurement).
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import numpy.typing as npt

from pipeline.prefix.hashmap import (
    TableParts,
    part_of,
    parts_grow_if_full,
    table_hash,
    table_part,
    table_prefetch,
    table_probe,
    table_row,
    table_set,
)

# Parts of the table (each grows on its own: growth costs 1/64 of the table, not a copy).
_PARTS = 64
# Lookups whose first slot is prefetched ahead of the one being made (the flat chains say which
# blocks come next, so their cache misses overlap; a later row's group is taken as this row's).
_AHEAD = 16

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]


@numba.njit(cache=True, nogil=True, inline="always")  # type: ignore[misc]
def _probe(
    addresses: Any,
    lengths: Any,
    mask: np.uint64,
    shift: int,
    values: npt.NDArray[np.uint64],
    n_values: int,
    at: int,
    g: int,
) -> tuple[int, npt.NDArray[np.uint64], int]:
    """The part, its table and the slot of ``(values[at], g)`` (found, or where it would go),
    with the key ``_AHEAD`` places on (below ``n_values``) prefetched so that lookups overlap."""
    if at + _AHEAD < n_values:
        ahead = table_hash(values[at + _AHEAD], g)
        table_prefetch(table_part(addresses, lengths, part_of(ahead, mask)), ahead)
    h = table_hash(values[at], g)
    part = part_of(h, mask)
    table = table_part(addresses, lengths, part)
    return part, table, table_probe(table, values[at], g, shift, h)


@numba.njit(cache=True, nogil=True)  # type: ignore[misc]
def replay_chunk(
    owners: Any,
    addresses: I64,
    lengths: I64,
    used: I64,
    shift: int,
    offsets: I64,
    values: U64,
    row0: int,
    prompt_blocks: I32,
    known: npt.NDArray[np.bool_],
    arrival_us: I64,
    group: I64,
    buckets_us: npt.NDArray[np.float64],
    hit: I32,
    age: I64,
    within: I32,
) -> None:
    """Replay the chunk's rows ``row0 + i`` (chain ``values[offsets[i]:offsets[i + 1]]``) in
    order against a packed table in parts (``pipeline.prefix.hashmap.TableParts``: ``owners``,
    ``addresses``, ``lengths``, ``used``), growing its parts as needed.

    Per-request arrays are indexed by the global row: ``prompt_blocks`` (already at most the
    chain's length), ``known``, ``arrival_us``, ``group`` (empty = all 0). Per row it writes the
    leading prompt blocks an earlier row of its group held (``hit``); when ``age`` is not empty
    the age in µs of the deepest one's last holder (-1 without a hit), and the leading blocks
    whose last holder is at most ``buckets_us[b]`` old (``within[:, b]``). After its lookup
    every block of the row (prompt and output) records the row as latest."""
    n_buckets = buckets_us.shape[0]
    track_age = age.shape[0] > 0
    mask = np.uint64(addresses.shape[0] - 1)
    n_values = offsets[offsets.shape[0] - 1]
    open_bucket = np.zeros(n_buckets, dtype=np.bool_)
    longest = 0
    for i in range(offsets.shape[0] - 1):
        longest = max(longest, offsets[i + 1] - offsets[i])
    found = np.zeros(longest + 1, dtype=np.int64)
    found_part = np.zeros(longest + 1, dtype=np.int64)
    for i in range(offsets.shape[0] - 1):
        r = row0 + i
        if not known[r]:
            continue
        g = group[r] if group.shape[0] else 0
        start = offsets[i]
        length = offsets[i + 1] - start
        pb = min(prompt_blocks[r], length)
        for b in range(n_buckets):
            open_bucket[b] = True
        k = 0
        while k < pb:
            key = values[start + k]
            part, table, slot = _probe(
                addresses, lengths, mask, shift, values, n_values, start + k, g
            )
            if table[2 * slot + 1] == 0:
                break
            found[k] = slot
            found_part[k] = part
            if track_age:
                a = arrival_us[r] - arrival_us[table_row(table, slot, shift)]
                age[r] = a
                for b in range(n_buckets):
                    if open_bucket[b] and a <= buckets_us[b]:
                        within[r, b] += 1
                    else:
                        open_bucket[b] = False
            k += 1
        hit[r] = k
        # The hit blocks' slots are known (no insert happened since the lookup): refresh them
        # without probing again; then insert or refresh the rest of the chain.
        for j in range(k):
            table = table_part(addresses, lengths, found_part[j])
            table_set(table, found[j], values[start + j], g, r, shift)
        for j in range(k, length):
            key = values[start + j]
            part, table, slot = _probe(
                addresses, lengths, mask, shift, values, n_values, start + j, g
            )
            if table_set(table, slot, key, g, r, shift):
                used[part] += 1
                parts_grow_if_full(owners, addresses, lengths, used, part, shift)


class Replay:
    """One replay fed chunk by chunk (see :func:`replay_chunk`); ``hit`` (and ``age``,
    ``within`` when ``with_age``) fill in as the chunks arrive."""

    def __init__(
        self,
        n: int,
        shift: int,
        prompt_blocks: I32,
        known: npt.NDArray[np.bool_],
        arrival_us: I64,
        group: I64,
        buckets_us: npt.NDArray[np.float64],
        *,
        with_age: bool,
    ) -> None:
        self.shift = shift
        self.prompt_blocks = prompt_blocks
        self.known = known
        self.arrival_us = arrival_us
        self.group = group
        self.buckets_us = buckets_us if with_age else np.zeros(0, np.float64)
        self.hit = np.zeros(n, dtype=np.int32)
        self.age = np.full(n if with_age else 0, -1, dtype=np.int64)
        self.within = np.zeros((n if with_age else 0, self.buckets_us.shape[0]), dtype=np.int32)
        self.table = TableParts(_PARTS)

    def feed(self, row0: int, offsets: I64, values: U64) -> None:
        replay_chunk(
            self.table.owners,
            self.table.addresses,
            self.table.lengths,
            self.table.used,
            self.shift,
            offsets,
            values,
            row0,
            self.prompt_blocks,
            self.known,
            self.arrival_us,
            self.group,
            self.buckets_us,
            self.hit,
            self.age,
            self.within,
        )

    def close(self) -> None:
        """Drop the table (the per-request results stay)."""
        self.table = TableParts(1)
