"""The unbounded prefix-cache replay behind the prefix stage's reuse potential, streamed:
requests arrive in chunks (in arrival order) and only the table of distinct blocks stays in
memory; every per-request array is the chunk's.

One pass in arrival order with a packed open-addressing table (numba, ``pipeline.prefix.hashmap``)
from (block hash, group) to the arrival (µs after the first request) of the most recent request
that held it. The group keeps caches apart
exactly: the shared replay's group is the request's (model, LoRA adapter) namespace; the
same-tenant replay's is its (namespace, tenant), which gives what replaying each tenant's
requests alone would, in one pass and the same kind of table (the stage runs it in a second pass
over the chains, after the shared table is gone). The table is in 64 parts
that grow one at a time, so growing never holds two copies of it. Memory is the table: 23-34
bytes per distinct (block, group) (``pipeline.prefix.hashmap``), whatever the number of blocks.

Past ``budget`` distinct keys the exact pass stops (:attr:`Replay.overflowed`) and the caller
replays again sampled (:func:`replay_sampled_chunk`): SHARDS's spatial sampling (Waldspurger et
al., FAST '15) keeps a block when ``splitmix64(hash) < rate · 2^64``, so every use of a kept
block is seen and whether it was held before is decided exactly; the rate halves (the table
thinned part by part) whenever the kept blocks pass the budget again. A block hash identifies
its whole prefix, so a request's held blocks are its leading ones and its hits are the count of
its held prompt blocks: the sampled pass sums, per part of the table, the kept uses and the held
ones (each weighted 1 / rate), the ratio estimators the caller scales to the exact totals.

A vectorised version (explode every block, stable sort by hash, previous holder = previous
row) gives the same answer but sorts every block and holds the whole table; this pass is linear
in the blocks (docs/prefix.md, "Memory: out of core", has the measurement).
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
import numpy.typing as npt

from pipeline.prefix.hashmap import (
    TableParts,
    part_of,
    parts_find,
    parts_grow_if_full,
    parts_rebuilt,
    splitmix64,
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
    prompt_blocks: I32,
    known: npt.NDArray[np.bool_],
    time_us: I64,
    group: I64,
    buckets_us: npt.NDArray[np.float64],
    hit: I32,
    age: I64,
    within: I32,
) -> None:
    """Replay a chunk's rows (chain ``values[offsets[i]:offsets[i + 1]]``) in order against a
    packed table in parts (``pipeline.prefix.hashmap.TableParts``: ``owners``, ``addresses``,
    ``lengths``, ``used``), growing its parts as needed.

    Per-row arrays are the chunk's: ``prompt_blocks`` (already at most the chain's length),
    ``known``, ``time_us`` (arrival, µs after the first request: below ``2^shift``), ``group``
    (empty = all 0). Per row it writes the leading prompt blocks an earlier row of its group
    held (``hit``); when ``age`` is not empty the age in µs of the deepest one's last holder
    (-1 without a hit), and the leading blocks whose last holder is at most ``buckets_us[b]``
    old (``within[:, b]``). After its lookup every block of the row (prompt and output) records
    the row's arrival as latest."""
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
        if not known[i]:
            continue
        g = group[i] if group.shape[0] else 0
        start = offsets[i]
        length = offsets[i + 1] - start
        pb = min(prompt_blocks[i], length)
        for b in range(n_buckets):
            open_bucket[b] = True
        k = 0
        while k < pb:
            part, table, slot = _probe(
                addresses, lengths, mask, shift, values, n_values, start + k, g
            )
            if table[2 * slot + 1] == 0:
                break
            found[k] = slot
            found_part[k] = part
            if track_age:
                a = time_us[i] - table_row(table, slot, shift)
                age[i] = a
                for b in range(n_buckets):
                    if open_bucket[b] and a <= buckets_us[b]:
                        within[i, b] += 1
                    else:
                        open_bucket[b] = False
            k += 1
        hit[i] = k
        # The hit blocks' slots are known (no insert happened since the lookup): refresh them
        # without probing again; then insert or refresh the rest of the chain.
        for j in range(k):
            table = table_part(addresses, lengths, found_part[j])
            table_set(table, found[j], values[start + j], g, time_us[i], shift)
        for j in range(k, length):
            key = values[start + j]
            part, table, slot = _probe(
                addresses, lengths, mask, shift, values, n_values, start + j, g
            )
            if table_set(table, slot, key, g, time_us[i], shift):
                used[part] += 1
                parts_grow_if_full(owners, addresses, lengths, used, part, shift)


# Columns of a sampled replay's per-part sums (then one per age bucket): weighted kept uses of
# prompt blocks and the held ones among them; the same at block 0 only; and below the hit limit.
USES, HELD, USES_FIRST, HELD_FIRST, USES_LIMIT, HELD_LIMIT, HELD_WITHIN = range(7)


@numba.njit(cache=True, nogil=True)  # type: ignore[misc]
def replay_sampled_chunk(
    owners: Any,
    addresses: I64,
    lengths: I64,
    used: I64,
    shift: int,
    offsets: I64,
    values: U64,
    prompt_blocks: I32,
    limit: I64,
    known: npt.NDArray[np.bool_],
    time_us: I64,
    group: I64,
    buckets_us: npt.NDArray[np.float64],
    threshold: np.uint64,
    weight: float,
    sums: npt.NDArray[np.float64],
    ages: I64,
) -> int:
    """:func:`replay_chunk` on the blocks whose ``splitmix64`` is below ``threshold`` only:
    per use of a kept prompt block, ``weight`` is added to a row of ``sums`` picked by its hash
    (as many rows as a power of two: random groups of the kept hashes; columns above; ``HELD_WITHIN + b`` when held and its last holder is at most ``buckets_us[b]`` old,
    below the row's hit limit ``limit``), and when ``ages`` is not empty the age (µs) of each
    held one below the limit is written there. Returns how many ages were written."""
    n_buckets = buckets_us.shape[0]
    track_age = ages.shape[0] > 0
    groups = np.uint64(sums.shape[0] - 1)
    m = 0
    for i in range(offsets.shape[0] - 1):
        if not known[i]:
            continue
        g = group[i] if group.shape[0] else 0
        start = offsets[i]
        length = offsets[i + 1] - start
        pb = min(prompt_blocks[i], length)
        below = min(limit[i], pb)
        # every lookup before the row's own blocks are recorded, as in the exact pass
        for k in range(pb):
            key = values[start + k]
            kept = splitmix64(key)
            if kept >= threshold:
                continue
            _, table, slot = parts_find(addresses, lengths, key, g, shift)
            held = table[2 * slot + 1] != 0
            # the sums' row: a random group of the kept hashes (every group's uses of a hash
            # are kept or dropped together, so they fall in one row)
            row = part_of(kept, groups)
            sums[row, USES] += weight
            sums[row, HELD] += weight * held
            if k == 0:
                sums[row, USES_FIRST] += weight
                sums[row, HELD_FIRST] += weight * held
            if k < below:
                sums[row, USES_LIMIT] += weight
                if held:
                    sums[row, HELD_LIMIT] += weight
                    a = time_us[i] - table_row(table, slot, shift)
                    for b in range(n_buckets):
                        if a <= buckets_us[b]:
                            sums[row, HELD_WITHIN + b] += weight
                    if track_age:
                        ages[m] = a
                        m += 1
        for k in range(length):
            key = values[start + k]
            if splitmix64(key) >= threshold:
                continue
            part, table, slot = parts_find(addresses, lengths, key, g, shift)
            if table_set(table, slot, key, g, time_us[i], shift):
                used[part] += 1
                parts_grow_if_full(owners, addresses, lengths, used, part, shift)
    return m


def power_of_two_rate(share: float, most_halvings: int = 62) -> float:
    """The power of two (1/2, 1/4, … down to 2^-``most_halvings``) nearest to ``share`` on a log
    scale: a SHARDS rate that keeps a sample 0.71-1.41 times the one asked for and stays put
    while a table grows by days, until the table has doubled (a pass kept between days is then
    carried on, not made again every day)."""
    halvings = math.floor(-math.log2(share) + 0.5) if share > 0 else most_halvings
    return float(2.0 ** -min(max(halvings, 1), most_halvings))


def rate_threshold(rate: float) -> np.uint64:
    """The ``splitmix64`` bound below which a hash is kept at ``rate``."""
    return np.uint64(min(int(rate * 2.0**64), 2**64 - 1))


class Replay:
    """One replay fed chunk by chunk, exact (:meth:`feed`) or sampled (:meth:`feed_sampled`,
    when ``rate`` < 1).

    ``budget`` bounds the distinct (block, group) keys the table holds: an exact replay past it
    drops its table and sets :attr:`overflowed` (the caller replays again, sampled); a sampled
    one halves its rate, thinning the table, until it fits. ``shift``: bits of the arrival
    times (µs after the first request) it stores; without ages it stores none (the groups then
    have every bit but one)."""

    def __init__(
        self,
        shift: int,
        buckets_us: npt.NDArray[np.float64],
        *,
        with_age: bool,
        budget: int | None = None,
        rate: float = 1.0,
    ) -> None:
        self.shift = shift
        self.with_age = with_age
        self.buckets_us = buckets_us if with_age else np.zeros(0, np.float64)
        self.budget = budget
        self.rate = rate
        self.overflowed = False
        self.table = TableParts(_PARTS)
        self.sums = np.zeros((_PARTS, HELD_WITHIN + self.buckets_us.shape[0]), np.float64)
        self.keys_max = 0  # most distinct keys the table held after a chunk

    @property
    def sampled(self) -> bool:
        return self.rate < 1.0

    def feed(
        self,
        offsets: I64,
        values: U64,
        prompt_blocks: I32,
        known: npt.NDArray[np.bool_],
        time_us: I64,
        group: I64,
    ) -> tuple[I32, I64, I32]:
        """The chunk's rows replayed exactly: per row ``hit``, ``age`` and ``within`` (empty
        without ages). Past the budget the table is dropped and :attr:`overflowed` set."""
        n = offsets.shape[0] - 1
        hit = np.zeros(n, dtype=np.int32)
        age = np.full(n if self.with_age else 0, -1, dtype=np.int64)
        within = np.zeros((n if self.with_age else 0, self.buckets_us.shape[0]), dtype=np.int32)
        time_us = self._stored(time_us)
        replay_chunk(
            self.table.owners,
            self.table.addresses,
            self.table.lengths,
            self.table.used,
            self.shift,
            offsets,
            values,
            prompt_blocks,
            known,
            time_us,
            group,
            self.buckets_us,
            hit,
            age,
            within,
        )
        self.keys_max = max(self.keys_max, self.table.keys())
        if self.budget is not None and self.table.keys() > self.budget:
            self.overflowed = True
            self.close()
        return hit, age, within

    def feed_sampled(
        self,
        offsets: I64,
        values: U64,
        prompt_blocks: I32,
        limit: I64,
        known: npt.NDArray[np.bool_],
        time_us: I64,
        group: I64,
    ) -> tuple[I64, float]:
        """The chunk's kept uses added to :attr:`sums`; returns the ages (µs) of its held kept
        prompt blocks below the hit limit (empty without ages) and the weight each carries."""
        weight = 1.0 / self.rate
        time_us = self._stored(time_us)
        ages = np.empty(int(values.shape[0]) if self.with_age else 0, dtype=np.int64)
        m = replay_sampled_chunk(
            self.table.owners,
            self.table.addresses,
            self.table.lengths,
            self.table.used,
            self.shift,
            offsets,
            values,
            prompt_blocks,
            limit,
            known,
            time_us,
            group,
            self.buckets_us,
            rate_threshold(self.rate),
            weight,
            self.sums,
            ages,
        )
        self.keys_max = max(self.keys_max, self.table.keys())
        while self.budget is not None and self.table.keys() > self.budget:
            self.rate /= 2
            parts_rebuilt(
                self.table.owners,
                self.table.addresses,
                self.table.lengths,
                self.table.used,
                self.shift,
                rate_threshold(self.rate),
                np.zeros(0, np.int64),
            )
        return ages[:m], weight

    def _stored(self, time_us: I64) -> I64:
        return time_us if self.with_age else np.zeros_like(time_us)

    def close(self) -> None:
        """Drop the table (the sums stay)."""
        self.table = TableParts(1)
