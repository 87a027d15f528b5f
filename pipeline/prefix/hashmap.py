"""Open-addressing hash tables from uint64 keys to row ids, for numba kernels.

Slots are probed linearly from ``splitmix64(key)``; there is no deletion: kernels that need an
empty table start a new one.

Functions (all numba-compiled, callable from other kernels and from Python):
- ``dense_ids(keys)``: keys → ids 0..n-1 in order of first appearance (its own table, keys and
  ids interleaved, sized from a sample of the distinct keys; a long array on a machine with
  more than one core is numbered in two halves side by side, then the second half's keys are
  looked up in the first half's table).

The *packed table* is for long streaming passes whose memory is the
table itself (the prefix stage's out-of-core replay): one uint64 array of ``2 · size`` slots
(``table[2s]`` the key, ``table[2s + 1]`` the value + 1, 0 = free), so a probe costs one cache
miss; the value packs a small ``group`` above a ``row`` (``group << shift | row``), and a slot
matches only the same key *and* group, so requests of different groups (tenants, model / LoRA
namespaces) never see each other's keys, exactly, in one table. Filled up to 7/10 and grown by
half (``table_grow_if_full``), it needs 23-34 bytes per key:
- ``new_table(expected)``, ``row_bits(n)`` (the ``shift`` for rows 0..n-1);
- ``table_find(table, key, group, shift)``: the slot holding (key, group), or the free slot where
  it would go (``table[2 * slot + 1] == 0``);
- ``table_row(table, slot, shift)``, ``table_set(table, slot, key, group, row, shift)``;
- ``table_grow_if_full(table, used, shift)``;
- :class:`TableParts`, ``part_of``, ``table_part``, ``parts_grow_if_full``, ``table_hash``,
  ``table_probe(..., h)``, ``parts_find``: a table in parts that grow one at a time (growth then
  never holds two copies of the whole table); ``parts_rebuilt`` thins or renumbers it part by
  part.

Used by the session inference (``pipeline.prefix.sessions``), the unbounded reuse replay
(``pipeline.prefix.replay``) and the dense block ids of the simulation (``pipeline.sim.blocks``).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numba as nb
import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.typed import List
from numpy.typing import NDArray

U64 = NDArray[np.uint64]
I64 = NDArray[np.int64]

_MIN_SIZE = 16

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_ONE = np.uint64(1)
# A threshold that keeps every key (parts_rebuilt).
KEEP_ALL = np.uint64(2**64 - 1)


# LLVM names the prefetch intrinsic by its pointer type: opaque pointers from LLVM 15.
_PREFETCH = "llvm.prefetch.p0" if llvm.llvm_version_info[0] >= 15 else "llvm.prefetch.p0i8"


@intrinsic
def prefetch(typingctx: Any, array: Any, index: Any) -> Any:
    """Hint the CPU to load ``array[index]`` into its caches (no effect on the result).

    A loop whose memory accesses are random but known a few iterations ahead (hash table
    slots, block state) issues them early, so their cache misses overlap.
    """
    if not isinstance(array, types.Array) or not isinstance(index, types.Integer):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        array_type = signature.args[0]
        view = context.make_array(array_type)(context, builder, args[0])
        pointer = cgutils.get_item_pointer(  # type: ignore[no-untyped-call]
            context, builder, array_type, view, [args[1]], wraparound=False
        )
        byte_pointer = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        function = cgutils.get_or_insert_function(  # type: ignore[no-untyped-call]
            builder.module,
            ir.FunctionType(ir.VoidType(), [byte_pointer, i32, i32, i32]),
            _PREFETCH,
        )
        # read, highest locality, data cache
        arguments = [builder.bitcast(pointer, byte_pointer), i32(0), i32(3), i32(1)]
        builder.call(function, arguments)
        return context.get_dummy_value()

    return types.void(array, index), codegen


@nb.njit(cache=True, inline="always")
def splitmix64(x: np.uint64) -> np.uint64:
    """SplitMix64 finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mixer."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


# Packed table: at most 7/10 full, grown by half (see the module docstring).
_TABLE_LOAD_NUM = 7
_TABLE_LOAD_DEN = 10


def row_bits(n: int) -> int:
    """Bits that hold a row 0..n-1 (at least 1), the ``shift`` of a packed table over n rows;
    the groups then have ``63 - shift`` bits."""
    return max(1, int(n - 1).bit_length() if n > 1 else 1)


@nb.njit(cache=True)
def new_table(expected: int) -> U64:
    """An empty packed table that holds ``expected`` keys without growing."""
    size = max(_MIN_SIZE, expected * _TABLE_LOAD_DEN // _TABLE_LOAD_NUM + 16)
    return np.zeros(2 * size, np.uint64)


@nb.njit(cache=True, inline="always")
def table_hash(key: np.uint64, group: int) -> np.uint64:
    """The mixed hash of (key, group): its high 32 bits place it in a table, its low bits pick
    the part of a :func:`new_parts` table."""
    return splitmix64(key ^ splitmix64(np.uint64(group)))


@nb.njit(cache=True, inline="always")
def _table_home(table: U64, h: np.uint64) -> int:
    """First slot probed for the mixed hash ``h``: its high 32 bits scaled to the table's size
    (multiply-shift, so the size need not be a power of two)."""
    size = table.size >> 1
    return np.int64(((h >> np.uint64(32)) * np.uint64(size)) >> np.uint64(32))  # type: ignore[return-value]


@nb.njit(cache=True, inline="always")
def table_prefetch(table: U64, h: np.uint64) -> None:
    """Hint the CPU to load the first slot a lookup of mixed hash ``h`` probes."""
    prefetch(table, 2 * _table_home(table, h))  # type: ignore[call-arg]


@nb.njit(cache=True, inline="always")
def table_probe(table: U64, key: np.uint64, group: int, shift: int, h: np.uint64) -> int:
    """:func:`table_find` with (key, group)'s :func:`table_hash` ``h`` given."""
    size = table.size >> 1
    slot = _table_home(table, h)
    g = np.uint64(group)
    s = np.uint64(shift)
    while True:
        stored = table[2 * slot + 1]
        if stored == 0 or (table[2 * slot] == key and ((stored - _ONE) >> s) == g):
            return slot  # type: ignore[no-any-return]
        slot += 1
        if slot == size:
            slot = 0


@nb.njit(cache=True, inline="always")
def table_find(table: U64, key: np.uint64, group: int, shift: int) -> int:
    """The slot holding (key, group), or the free slot where it would be inserted."""
    return table_probe(table, key, group, shift, table_hash(key, group))  # type: ignore[no-any-return]


@nb.njit(cache=True, inline="always")
def table_row(table: U64, slot: int, shift: int) -> int:
    """The row stored in an occupied slot."""
    mask = (_ONE << np.uint64(shift)) - _ONE
    return np.int64((table[2 * slot + 1] - _ONE) & mask)  # type: ignore[return-value]


@nb.njit(cache=True, inline="always")
def table_set(table: U64, slot: int, key: np.uint64, group: int, row: int, shift: int) -> bool:
    """Store ``row`` under (key, group) at ``slot`` (from :func:`table_find`, nothing inserted
    since); True when the slot was free (one more key)."""
    new = table[2 * slot + 1] == 0
    table[2 * slot] = key
    table[2 * slot + 1] = ((np.uint64(group) << np.uint64(shift)) | np.uint64(row)) + _ONE
    return bool(new)


@nb.njit(cache=True)
def _table_grown(table: U64, shift: int) -> U64:
    size = table.size >> 1
    grown = np.zeros(2 * (size + size // 2 + 16), np.uint64)
    s = np.uint64(shift)
    for i in range(size):
        stored = table[2 * i + 1]
        if stored != 0:
            slot = table_find(grown, table[2 * i], int((stored - _ONE) >> s), shift)
            grown[2 * slot] = table[2 * i]
            grown[2 * slot + 1] = stored
    return grown


@nb.njit(cache=True, inline="always")
def table_grow_if_full(table: U64, used: int, shift: int) -> U64:
    """The table, grown by half when ``used`` keys fill more than 7/10 of it (slots found
    before are then stale)."""
    if used * _TABLE_LOAD_DEN > (table.size >> 1) * _TABLE_LOAD_NUM:
        return _table_grown(table, shift)
    return table


@intrinsic
def _address_pointer(typingctx: Any, address: Any) -> Any:
    """The uint64 pointer at an integer address."""
    if not isinstance(address, types.Integer):
        return None
    pointer = types.CPointer(types.uint64)  # type: ignore[no-untyped-call]

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], context.get_value_type(pointer))

    return pointer(address), codegen


class TableParts:
    """A packed table in ``parts`` parts (a power of two): (key, group) lives in part
    ``table_hash & (parts - 1)`` and each part grows on its own, so growing never holds two
    copies of the whole table (the prefix replay's tables are the stage's largest memory).

    Kernels reach a part through ``addresses`` / ``lengths`` (:func:`table_part`, a view with no
    reference counting, so a lookup costs what one table's does); ``owners`` (a numba typed
    list) holds the parts' arrays and is touched only when a part grows
    (:func:`parts_grow_if_full`)."""

    def __init__(self, parts: int, expected: int = 0) -> None:
        # ``expected`` keys in all: each part sized for its share, with room for the spread
        each = expected // parts + 4 * int(np.sqrt(expected / parts)) if expected else 0
        self.owners = List()
        for _ in range(parts):
            self.owners.append(new_table(each))
        self.addresses = np.array([t.ctypes.data for t in self.owners], dtype=np.int64)
        self.lengths = np.array([t.size for t in self.owners], dtype=np.int64)
        self.used = np.zeros(parts, dtype=np.int64)

    def __getstate__(self) -> dict[str, Any]:
        # the typed list and the raw addresses cannot be pickled: the parts' arrays are
        return {"tables": [np.asarray(t) for t in self.owners], "used": self.used}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.owners = List()
        for table in state["tables"]:
            self.owners.append(table)
        self.addresses = np.array([t.ctypes.data for t in self.owners], dtype=np.int64)
        self.lengths = np.array([t.size for t in self.owners], dtype=np.int64)
        self.used = state["used"]

    def keys(self) -> int:
        return int(self.used.sum())

    def nbytes(self) -> int:
        return int(self.lengths.sum()) * 8


@nb.njit(cache=True, inline="always")
def table_part(addresses: I64, lengths: I64, part: int) -> U64:
    """Part ``part`` of a :class:`TableParts` as an array view."""
    return nb.carray(_address_pointer(addresses[part]), lengths[part])  # type: ignore[attr-defined,call-arg,no-any-return]


@nb.njit(cache=True, inline="always")
def part_of(h: np.uint64, mask: np.uint64) -> int:
    """The part of a :class:`TableParts` (``mask`` = parts - 1) holding mixed hash ``h``."""
    return np.int64(h & mask)  # type: ignore[return-value]


@nb.njit(cache=True, inline="always")
def parts_find(
    addresses: I64, lengths: I64, key: np.uint64, group: int, shift: int
) -> tuple[int, U64, int]:
    """The part of a :class:`TableParts` that holds (key, group), the part as an array view and
    the slot holding it, or the free slot where it would be inserted."""
    h = table_hash(key, group)
    part = part_of(h, np.uint64(addresses.shape[0] - 1))
    table = table_part(addresses, lengths, part)
    return part, table, table_probe(table, key, group, shift, h)


@nb.njit(cache=True)
def parts_grow_if_full(
    owners: Any, addresses: I64, lengths: I64, used: I64, part: int, shift: int
) -> None:
    """Grow part ``part`` when full (views of it taken before are then stale)."""
    table = owners[part]
    grown = table_grow_if_full(table, used[part], shift)
    if grown.size != table.size:
        owners[part] = grown
        addresses[part] = grown.ctypes.data
        lengths[part] = grown.size


@nb.njit(cache=True)
def parts_rebuilt(
    owners: Any,
    addresses: I64,
    lengths: I64,
    used: I64,
    shift: int,
    threshold: np.uint64,
    new_row: I64,
) -> None:
    """Rebuild a :class:`TableParts` part by part (one part's copy at a time), keeping the keys
    whose ``splitmix64`` is below ``threshold`` (every key at ``2^64 - 1``) and, when
    ``new_row`` is not empty, whose row ``r`` has ``new_row[r] >= 0``, stored with that row
    instead (the carried state renumbered)."""
    s = np.uint64(shift)
    renumber = new_row.shape[0] > 0
    every = threshold == KEEP_ALL
    for part in range(addresses.shape[0]):
        table = owners[part]
        size = table.size >> 1
        kept = 0
        for i in range(size):
            stored = table[2 * i + 1]
            if (
                stored != 0
                and (every or splitmix64(table[2 * i]) < threshold)
                and (not renumber or new_row[table_row(table, i, shift)] >= 0)
            ):
                kept += 1
        fresh = new_table(kept)
        for i in range(size):
            stored = table[2 * i + 1]
            if stored == 0 or not (every or splitmix64(table[2 * i]) < threshold):
                continue
            group = int((stored - _ONE) >> s)
            row = table_row(table, i, shift)
            if renumber:
                row = new_row[row]
                if row < 0:
                    continue
            slot = table_find(fresh, table[2 * i], group, shift)
            table_set(fresh, slot, table[2 * i], group, row, shift)
        owners[part] = fresh
        addresses[part] = fresh.ctypes.data
        lengths[part] = fresh.size
        used[part] = kept


@nb.njit(cache=True, nogil=True)
def _distinct_estimate(keys: U64, shift: int) -> int:
    """About how many distinct keys there are: the distinct keys among those whose mixed hash
    has its top ``shift`` bits zero (a 2^-shift sample of the distinct keys, whatever their
    repetitions), times 2^shift; -1 when the sample is unexpectedly large."""
    size = 64
    while size < 4 * (keys.size >> shift) + 64:
        size *= 2
    sample = np.zeros(size, np.uint64)
    mask = size - 1
    top = np.uint64(64 - shift)
    n = 0
    for i in range(keys.size):
        h = splitmix64(keys[i])
        if (h >> top) != 0:
            continue
        slot = np.int64((h * _GOLDEN) >> np.uint64(40)) & mask
        while sample[slot] != 0 and sample[slot] != h:
            slot = (slot + 1) & mask
        if sample[slot] == 0:
            sample[slot] = h
            n += 1
            if 2 * n > size:
                return -1
    return n << shift


@nb.njit(cache=True, inline="always")
def _pair_home(table: U64, key: np.uint64) -> int:
    """Where the probe for ``key`` starts: the hash's high 32 bits scaled to the table's size
    (Lemire's multiply-shift), so the table need not be a power of two (below 2^32 slots)."""
    size = table.size >> 1
    home = ((splitmix64(key) >> np.uint64(32)) * np.uint64(size)) >> np.uint64(32)
    return np.int64(home)  # type: ignore[return-value]  # numba int64


@nb.njit(cache=True, inline="always")
def _pair_slot(table: U64, key: np.uint64) -> int:
    """Slot of ``key`` in an interleaved table (``table[2s]`` key, ``table[2s + 1]`` id + 1,
    0 = free), or the free slot where it would go."""
    size = table.size >> 1
    slot = _pair_home(table, key)
    while table[2 * slot + 1] != 0 and table[2 * slot] != key:
        slot += 1
        if slot == size:
            slot = 0
    return slot


@nb.njit(cache=True)
def _pair_grown(table: U64) -> U64:
    grown = np.zeros(3 * table.size, np.uint64)
    for s in range(table.size >> 1):
        if table[2 * s + 1] != 0:
            slot = _pair_slot(grown, table[2 * s])
            grown[2 * slot] = table[2 * s]
            grown[2 * slot + 1] = table[2 * s + 1]
    return grown


_PREFETCH_DISTANCE = 16  # lookups issued ahead of the one being made


@nb.njit(cache=True, nogil=True)
def _dense_run(
    keys: U64, out: Any, table: U64, first: Any, start: int, n_distinct: int
) -> tuple[int, int]:
    """Number ``keys[start:]`` until the table is two thirds full (or ``first``, where each id
    first appears, is full, when it is not empty); returns where it stopped and the ids handed
    out so far."""
    limit = (table.size >> 1) * 2 // 3  # keys the table holds at most two thirds full
    if first.size:
        limit = min(limit, first.size)
    ahead = keys.size - _PREFETCH_DISTANCE
    for i in range(start, keys.size):
        if i < ahead:
            prefetch(table, 2 * _pair_home(table, keys[i + _PREFETCH_DISTANCE]))  # type: ignore[call-arg]
        key = keys[i]
        slot = _pair_slot(table, key)
        stored = table[2 * slot + 1]
        if stored != 0:
            out[i] = np.int64(stored) - 1
            continue
        if n_distinct >= limit:
            return i, n_distinct
        out[i] = n_distinct
        if first.size:
            first[n_distinct] = i
        n_distinct += 1
        table[2 * slot] = key
        table[2 * slot + 1] = np.uint64(n_distinct)
    return keys.size, n_distinct


@nb.njit(cache=True, nogil=True)
def _numbered(keys: U64, out: Any, expected: int, firsts: bool) -> tuple[int, U64, Any]:
    """Ids in order of first appearance into ``out``, on a table sized for ``expected``
    distinct keys (grown past it); returns how many, the table and (with ``firsts``) where
    each id first appears. Key and id share one interleaved table, so a lookup costs one cache
    miss, and the slot of the key 16 places ahead is prefetched, so the misses overlap."""
    size = max(_MIN_SIZE, 3 * expected // 2 + 16)  # at most two thirds full
    table = np.zeros(2 * size, np.uint64)
    first = np.empty(expected + 16 if firsts else 0, out.dtype)
    done, n_distinct = _dense_run(keys, out, table, first, 0, 0)
    while done < keys.size:
        if n_distinct >= (table.size >> 1) * 2 // 3:  # _dense_run's limit
            table = _pair_grown(table)
        if firsts and n_distinct >= first.size:
            grown = np.empty(2 * first.size, first.dtype)
            grown[:n_distinct] = first[:n_distinct]
            first = grown
        done, n_distinct = _dense_run(keys, out, table, first, done, n_distinct)
    return n_distinct, table, first[:n_distinct]


@nb.njit(cache=True)
def _dense_ids(keys: U64, out: Any, expected: int) -> int:
    """:func:`_numbered`'s count alone."""
    return _numbered(keys, out, expected, False)[0]


@nb.njit(cache=True)
def _join_halves(keys: U64, first: Any, table: U64, n_first: int) -> int:
    """Global ids of the second half's local ids, from the first half's ``table``: a key the
    first half holds keeps its id, the others number on from ``n_first`` in their local order
    (their order of first appearance). Written over ``first``; returns the total count."""
    n = n_first
    ahead = first.size - _PREFETCH_DISTANCE
    for local in range(first.size):
        if local < ahead:
            prefetch(table, 2 * _pair_home(table, keys[first[local + _PREFETCH_DISTANCE]]))  # type: ignore[call-arg]
        stored = table[2 * _pair_slot(table, keys[first[local]]) + 1]
        if stored != 0:
            first[local] = np.int64(stored) - 1
        else:
            first[local] = n
            n += 1
    return n


@nb.njit(cache=True, nogil=True)
def _relabel(out: Any, to_global: Any) -> None:
    for i in range(out.size):
        out[i] = to_global[out[i]]


# A 1/64 sample of the distinct keys sizes the table (about 1.6 % of the keys are hashed into it).
_ESTIMATE_SHIFT = 6


# Arrays at least this long are numbered in two halves side by side (when there are two cores).
_HALVES_FROM = 1 << 22


def _expected(keys: U64) -> int:
    """Distinct keys to size a table for: the sampled estimate with some room."""
    estimate = int(_distinct_estimate(keys, _ESTIMATE_SHIFT)) if keys.size > 1 << 16 else -1
    return min(keys.size, estimate + estimate // 8 + 1024 if estimate >= 0 else 1 << 22)


def dense_ids(keys: U64) -> tuple[Any, int]:
    """Map 64-bit keys to dense ids 0..n-1 in order of first appearance (int32 when it fits)."""
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    out: Any = np.empty(keys.size, np.int32 if keys.size < 2**31 - 1 else np.int64)
    if keys.size >= _HALVES_FROM and (os.cpu_count() or 1) > 1:
        return out, _dense_halves(keys, out)
    return out, int(_dense_ids(keys, out, _expected(keys)))


def _dense_halves(keys: U64, out: Any) -> int:
    """:func:`dense_ids` in two threads: each half numbered on its own table, then the second
    half's distinct keys looked up in the first half's table (:func:`_join_halves`) and its ids
    relabelled. The ids are the same as one pass's."""
    mid = keys.size // 2

    def number(lo: int, hi: int, firsts: bool) -> tuple[int, U64, Any]:
        part = keys[lo:hi]
        result: tuple[int, U64, Any] = _numbered(part, out[lo:hi], _expected(part), firsts)
        return result

    with ThreadPoolExecutor(1) as pool:
        second = pool.submit(number, mid, keys.size, True)
        n_first, table, _ = number(0, mid, False)
        _, _, local_first = second.result()
    n = int(_join_halves(keys[mid:], local_first, table, n_first))
    del table
    _relabel(out[mid:], local_first)
    return n


class DenseNumbering:
    """:func:`dense_ids` of keys handed over a batch at a time: the ids of each batch in order
    of first appearance over every batch so far, the same as :func:`dense_ids` gives their
    concatenation, while only the table of distinct keys is kept (not the keys)."""

    def __init__(self) -> None:
        self.table = np.zeros(2 * _MIN_SIZE, np.uint64)
        self.count = 0
        self._no_firsts = np.empty(0, np.int32)

    def number(self, keys: U64) -> NDArray[np.int32]:
        """The ids of ``keys`` (int32: at most 2^31 - 1 distinct keys in all, else ValueError)."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        out = np.empty(keys.size, np.int32)
        done, self.count = _dense_run(keys, out, self.table, self._no_firsts, 0, self.count)
        while done < keys.size:  # stopped two thirds full: grown, then on from there
            if self.count >= 2**31 - 1:
                raise ValueError("more than 2^31 - 1 distinct keys to number")
            self.table = _pair_grown(self.table)
            done, self.count = _dense_run(keys, out, self.table, self._no_firsts, done, self.count)
        return out
