"""One open-addressing hash map from uint64 keys to non-negative int64 values, for numba kernels.

A map is two arrays of one power-of-two size: ``keys`` (uint64) and ``values`` (int64, ``EMPTY``
= -1 marks a free slot, so stored values must be >= 0). Slots are probed linearly from
``splitmix64(key)``; the map is kept at most half full (``put`` doubles it past that), so a probe
sequence stays short. There is no deletion: kernels that need an empty map start a new one.

Functions (all numba-compiled, callable from other kernels and from Python):
- ``new_map(expected)``: an empty map sized for ``expected`` keys without growing;
- ``find_slot(keys, values, key)``: the slot holding ``key``, or the free slot where it would go
  (``values[slot] == EMPTY``); a caller that has the slot may overwrite ``values[slot]`` without
  probing again, as long as nothing was inserted since;
- ``get(keys, values, key)``: the value, or ``EMPTY``;
- ``put(keys, values, used, key, value)``: insert or overwrite; returns the (possibly grown) arrays
  and the new count of used slots;
- ``dense_ids(keys)``: keys → ids 0..n-1 in order of first appearance.

Used by the session inference (``pipeline.sessions``), the unbounded reuse replay
(``pipeline.prefix.replay``) and the dense block ids of the simulation (``pipeline.sim.blocks``).
"""

from __future__ import annotations

from typing import Any

import numba as nb
import numpy as np
from numpy.typing import NDArray

U64 = NDArray[np.uint64]
I64 = NDArray[np.int64]

EMPTY = -1
_MIN_SIZE = 16
_GROWTH = 2

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_ONE = np.uint64(1)


@nb.njit(cache=True, inline="always")
def splitmix64(x: np.uint64) -> np.uint64:
    """SplitMix64 finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mixer."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


@nb.njit(cache=True)
def new_map(expected: int) -> tuple[U64, I64]:
    """An empty map that holds ``expected`` keys without growing."""
    size = _MIN_SIZE
    while size < 2 * expected + 2:
        size *= 2
    return np.zeros(size, np.uint64), np.full(size, EMPTY, np.int64)


@nb.njit(cache=True, inline="always")
def find_slot(keys: U64, values: I64, key: np.uint64) -> int:
    """The slot holding ``key``, or the free slot where it would be inserted."""
    mask = np.uint64(keys.size - 1)
    slot = splitmix64(key) & mask
    while values[slot] != EMPTY and keys[slot] != key:
        slot = (slot + _ONE) & mask
    return int(slot)


@nb.njit(cache=True, inline="always")
def get(keys: U64, values: I64, key: np.uint64) -> int:
    """The value stored under ``key``, or ``EMPTY``."""
    return int(values[find_slot(keys, values, key)])


@nb.njit(cache=True)
def _grown(keys: U64, values: I64) -> tuple[U64, I64]:
    size = keys.size * _GROWTH
    new_keys = np.zeros(size, np.uint64)
    new_values = np.full(size, EMPTY, np.int64)
    for s in range(keys.size):
        if values[s] != EMPTY:
            slot = find_slot(new_keys, new_values, keys[s])
            new_keys[slot] = keys[s]
            new_values[slot] = values[s]
    return new_keys, new_values


@nb.njit(cache=True, inline="always")
def put(keys: U64, values: I64, used: int, key: np.uint64, value: int) -> tuple[U64, I64, int]:
    """Store ``value`` (>= 0) under ``key``; returns the map (grown when over half full) and
    the number of used slots."""
    slot = find_slot(keys, values, key)
    if values[slot] == EMPTY:
        keys[slot] = key
        used += 1
    values[slot] = value
    if 2 * used > keys.size:
        keys, values = _grown(keys, values)
    return keys, values, used


@nb.njit(cache=True)
def _dense_ids(keys: U64, out: Any) -> int:
    table_keys, table_values = new_map(min(keys.size, 1 << 22))
    n_distinct = 0
    for i in range(keys.size):
        slot = find_slot(table_keys, table_values, keys[i])
        value = table_values[slot]
        if value == EMPTY:
            out[i] = n_distinct
            table_keys, table_values, _ = put(
                table_keys, table_values, n_distinct, keys[i], n_distinct
            )
            n_distinct += 1
        else:
            out[i] = value
    return n_distinct


def dense_ids(keys: U64) -> tuple[Any, int]:
    """Map 64-bit keys to dense ids 0..n-1 in order of first appearance (int32 when it fits)."""
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    out: Any = np.empty(keys.size, np.int32 if keys.size < 2**31 - 1 else np.int64)
    return out, int(_dense_ids(keys, out))
