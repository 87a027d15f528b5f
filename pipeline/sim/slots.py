"""The block rows of a streamed replay: a (namespace, block hash) → slot table kept across chunks.

The streamed replay (:mod:`pipeline.sim.stream`) keeps each block's state (one int32 a replica,
:mod:`pipeline.sim.kernels`) in a row of its own, the block's *slot*, for as long as the block
is cached on some replica, so a chunk only looks up its own blocks: a block the table does not
hold takes a free slot, whose row is then ``NOT_CACHED`` on every replica. The slots of blocks
cached nowhere are reclaimed only when a chunk might not find enough free ones (one pass over
the rows), and the table grows, by half, only when it would still be two thirds full after
that: its rows follow the blocks cached and pinned at once, not the distinct blocks seen. Slot
numbers mean nothing to the replay (only which blocks are the same one), so its results do not
depend on them; a free queue's stale entries naming a slot since reused stay stale (an entry is
live only where its block's state points at it, and only the block's own admission or release
makes it point anywhere).

Layout: per slot, its block hash (``hashes``, uint64) and namespace (``spaces``, int32; -1: a
free slot, the free ones chained through ``hashes``), and an index of ``2 × slots`` int32
entries (slot + 1, 0 empty), probed linearly from the mixed hash of (hash, namespace)
(:func:`pipeline.prefix.hashmap.table_hash`); a deleted entry's followers shift back (no
tombstones), so probes stay short however many blocks come and go.
"""

from __future__ import annotations

from typing import Any

import numba as nb
import numpy as np
from numpy.typing import NDArray

from pipeline.prefix.hashmap import prefetch, table_hash
from pipeline.sim.blocks import SimulationInputError
from pipeline.sim.kernels import INT32_LIMIT, NOT_CACHED, guarded, require

I32 = NDArray[np.int32]
I64 = NDArray[np.int64]
U64 = NDArray[np.uint64]

# Slots a table starts with (and grows to at least).
MIN_SLOTS = 1024
# Slots stay below this, so the index (two entries a slot) keeps int32 positions.
MAX_SLOTS = INT32_LIMIT // 2
# Lookups whose first index position is fetched ahead of the one being made (their cache
# misses overlap).
_AHEAD = 16
# Fields of ``cursor``: the first free slot of the chain (-1: none), the slots handed out so
# far (those from here on are free and unchained), the slots in use.
_FREE = 0
_TOP = 1
_USED = 2


@nb.njit(cache=True, inline="always")
def _home(index: I32, hashed: np.uint64) -> int:
    """First index position probed for a mixed hash: its high 32 bits scaled to the size."""
    return np.int64(((hashed >> np.uint64(32)) * np.uint64(index.size)) >> np.uint64(32))  # type: ignore[return-value]


@nb.njit(cache=True, nogil=True)
def _find_or_add(
    index: I32, hashes: U64, spaces: I32, cursor: I64, keys: U64, namespace: I64, out: I32
) -> None:
    """``out[i]``: the slot of (``namespace[i]``, ``keys[i]``), a free one taken when the table
    does not hold it (room for every key is the caller's: :meth:`BlockSlots.reserve`)."""
    ahead = keys.size - _AHEAD
    for i in range(keys.size):
        if i < ahead:
            prefetch(index, _home(index, table_hash(keys[i + _AHEAD], namespace[i + _AHEAD])))  # type: ignore[call-arg]
        key = keys[i]
        space = namespace[i]
        position = _home(index, table_hash(key, space))
        while True:
            entry = index[position]
            if entry == 0:
                slot = cursor[_FREE]
                if slot >= 0:
                    cursor[_FREE] = np.int64(hashes[slot]) - 1
                else:
                    slot = cursor[_TOP]
                    cursor[_TOP] = slot + 1
                hashes[slot] = key
                spaces[slot] = space
                index[position] = slot + 1
                cursor[_USED] += 1
                break
            slot = entry - 1
            if hashes[slot] == key and spaces[slot] == space:
                break
            position += 1
            if position == index.size:
                position = 0
        out[i] = slot


@nb.njit(cache=True, inline="always")
def _cached(state: Any, slot: int) -> bool:
    """Whether any replica of any replay caches the block in ``slot``."""
    for replay in range(state.shape[0]):
        row = state[replay, slot]
        for k in range(row.size):
            if row[k] != NOT_CACHED:
                return True
    return False


@nb.njit(cache=True, inline="always")
def _delete(index: I32, hashes: U64, spaces: I32, slot: int) -> None:
    """Take ``slot``'s entry out of the index, shifting its followers back."""
    size = index.size
    hole = _home(index, table_hash(hashes[slot], spaces[slot]))
    while index[hole] != slot + 1:
        hole += 1
        if hole == size:
            hole = 0
    # A follower moves into the hole unless its home lies cyclically in (hole, position],
    # where the hole would put it before its home.
    position = hole
    while True:
        position += 1
        if position == size:
            position = 0
        entry = index[position]
        if entry == 0:
            break
        other = entry - 1
        home = _home(index, table_hash(hashes[other], spaces[other]))
        wrapped = hole > position
        stays = (home > hole or home <= position) if wrapped else hole < home <= position
        if not stays:
            index[hole] = entry
            hole = position
    index[hole] = 0


@nb.njit(cache=True, nogil=True)
def _reclaim(index: I32, hashes: U64, spaces: I32, cursor: I64, state: Any, keys: int) -> int:
    """Free every slot in use whose block no replica of any replay caches (its rows all
    ``NOT_CACHED``) into the free chain, making room for ``keys`` new ones; returns the slots
    still in use. Their index entries go one by one (followers shifted back) when few are
    freed; when most are, the index is built again from the rest, and when the table must
    grow (:meth:`BlockSlots.reserve`) it is left to the growth, which builds a new one."""
    top = cursor[_TOP]
    live = 0
    for slot in range(top):
        if spaces[slot] >= 0 and _cached(state, slot):
            live += 1
    grows = 3 * (live + keys) > 2 * hashes.size
    one_by_one = not grows and cursor[_USED] - live <= live
    for slot in range(top):
        if spaces[slot] < 0 or _cached(state, slot):
            continue
        if one_by_one:
            _delete(index, hashes, spaces, slot)
        spaces[slot] = -1
        hashes[slot] = np.uint64(cursor[_FREE] + 1)
        cursor[_FREE] = slot
    cursor[_USED] = live
    if not grows and not one_by_one:
        index[:] = 0
        _reindex(index, hashes, spaces, top)
    return live


@nb.njit(cache=True, nogil=True)
def _reindex(index: I32, hashes: U64, spaces: I32, top: int) -> None:
    """Enter every slot in use below ``top`` into the empty ``index``."""
    size = index.size
    for slot in range(top):
        if spaces[slot] < 0:
            continue
        position = _home(index, table_hash(hashes[slot], spaces[slot]))
        while index[position] != 0:
            position += 1
            if position == size:
                position = 0
        index[position] = slot + 1


def _check_find_or_add(kernel: str, a: dict[str, Any]) -> None:
    keys, namespace, out, cursor = a["keys"], a["namespace"], a["out"], a["cursor"]
    slots = a["hashes"].size
    require(
        keys.shape == namespace.shape == out.shape and a["spaces"].size == slots,
        kernel,
        "keys, namespace and out need one entry per key; hashes and spaces one per slot",
    )
    require(a["index"].size == 2 * slots, kernel, "the index needs two entries a slot")
    if namespace.size:
        require(
            int(namespace.min()) >= 0 and int(namespace.max()) < INT32_LIMIT,
            kernel,
            "namespaces must lie in 0..2^31-1",
        )
    require(
        slots - int(cursor[_USED]) >= keys.size,
        kernel,
        f"{keys.size} keys need as many free slots, the table has {slots - int(cursor[_USED])}",
    )


def _check_reclaim(kernel: str, a: dict[str, Any]) -> None:
    state = a["state"]
    require(
        state.ndim == 3 and state.shape[1] == a["hashes"].size,
        kernel,
        "state needs one row a slot for each replay",
    )


find_or_add = guarded(_find_or_add, _check_find_or_add)
reclaim = guarded(_reclaim, _check_reclaim)


class BlockSlots:
    """Blocks by slot and their state, carried from chunk to chunk, for ``replays`` replays of
    ``replicas`` replicas each: ``state[i]`` is replay i's (``slots × replicas`` int32,
    block-major, as :func:`pipeline.sim.kernels.replay_chunk` reads it); a slot is freed once
    no replay caches its block."""

    def __init__(self, replicas: int, replays: int = 1, slots: int | None = None) -> None:
        slots = MIN_SLOTS if slots is None else slots
        self.hashes = np.zeros(slots, np.uint64)
        self.spaces = np.full(slots, -1, np.int32)
        self.index = np.zeros(2 * slots, np.int32)
        self.cursor = np.array([-1, 0, 0], np.int64)
        self.state = np.full((replays, slots, replicas), NOT_CACHED, np.int32)
        self.peak_live = 0  # most blocks cached somewhere when slots were reclaimed

    @property
    def slots(self) -> int:
        return int(self.hashes.size)

    @property
    def used(self) -> int:
        return int(self.cursor[_USED])

    def reserve(self, keys: int) -> None:
        """Room for ``keys`` blocks new to the table: the slots of blocks cached nowhere are
        reclaimed when the free ones might not do, and the table grown by half when it would
        still be more than two thirds full (so reclaiming stays rare: amortised O(1) a key)."""
        if self.slots - self.used >= keys:
            return
        live = int(reclaim(self.index, self.hashes, self.spaces, self.cursor, self.state, keys))
        self.peak_live = max(self.peak_live, live)
        if 3 * (live + keys) > 2 * self.slots:
            self._grow(3 * (live + keys) // 2)

    def _grow(self, slots: int) -> None:
        if slots > MAX_SLOTS:
            raise SimulationInputError(
                f"{slots:,} blocks cached or pinned at once exceed the 2^30 of one replay"
            )
        old = self.slots
        top = int(self.cursor[_TOP])
        # each new array written once: the old rows copied, the new ones set
        hashes = np.empty(slots, np.uint64)
        hashes[:old] = self.hashes
        hashes[old:] = 0
        spaces = np.empty(slots, np.int32)
        spaces[:old] = self.spaces
        spaces[old:] = -1
        replays, _, replicas = self.state.shape
        state = np.empty((replays, slots, replicas), np.int32)
        state[:, :old] = self.state
        state[:, old:] = NOT_CACHED
        self.hashes, self.spaces, self.state = hashes, spaces, state
        self.index = np.zeros(2 * slots, np.int32)
        _reindex(self.index, self.hashes, self.spaces, top)

    def find(self, keys: U64, namespace: I64) -> I32:
        """The slot of each distinct (namespace, hash) key, a free one for a key the table does
        not hold (the table reclaimed or grown first when it might run out)."""
        self.reserve(keys.size)
        out = np.empty(keys.size, np.int32)
        find_or_add(self.index, self.hashes, self.spaces, self.cursor, keys, namespace, out)
        return out
