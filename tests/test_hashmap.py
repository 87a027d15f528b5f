"""The shared open-addressing tables (pipeline.prefix.hashmap) against a Python dict."""

from __future__ import annotations

import itertools

import numpy as np

from pipeline.prefix.hashmap import (
    DenseNumbering,
    _dense_halves,
    _dense_ids,
    dense_ids,
    new_table,
    row_bits,
    table_find,
    table_grow_if_full,
    table_row,
    table_set,
)


def test_dense_ids_number_keys_in_order_of_first_appearance() -> None:
    keys = np.array([7, 2**64 - 1, 7, 0, 2**64 - 1, 42, 0], dtype=np.uint64)
    ids, n = dense_ids(keys)
    assert ids.tolist() == [0, 1, 0, 2, 1, 3, 2]
    assert n == 4
    big = np.random.default_rng(1).integers(0, 5000, 100_000).astype(np.uint64)
    ids, n = dense_ids(big)
    first: dict[int, int] = {}
    want = [first.setdefault(k, len(first)) for k in big.tolist()]
    assert ids.tolist() == want
    assert n == len(first)
    empty, n_empty = dense_ids(np.zeros(0, np.uint64))
    assert empty.size == 0 and n_empty == 0


def test_dense_ids_agree_with_a_dict_whatever_the_table_size_guess() -> None:
    """The table is sized from a sample of the distinct keys and grown past the guess; a guess
    far too small or too large gives the same ids."""
    rng = np.random.default_rng(7)
    keys = np.concatenate(
        [rng.integers(0, 2**64, 150_000, dtype=np.uint64), np.arange(90_000, dtype=np.uint64)]
    )
    keys = keys[rng.integers(0, keys.size, 400_000)]
    first: dict[int, int] = {}
    want = [first.setdefault(k, len(first)) for k in keys.tolist()]
    ids, n = dense_ids(keys)
    assert ids.tolist() == want and n == len(first)
    for expected in (0, 1, 1000, 10 * len(first)):
        out = np.empty(keys.size, np.int64)
        assert _dense_ids(keys, out, expected) == len(first)
        assert out.tolist() == want


def test_two_halves_number_keys_as_one_pass() -> None:
    """Long arrays are numbered in two halves side by side, then joined: keys of both halves,
    of the second alone, repeated within a half, and an odd length give one pass's ids."""
    rng = np.random.default_rng(11)
    for size in (1, 2, 3, 1001, 300_001):
        keys = rng.integers(0, max(2, size // 3), size).astype(np.uint64) * np.uint64(2654435761)
        first: dict[int, int] = {}
        want = [first.setdefault(k, len(first)) for k in keys.tolist()]
        out = np.empty(keys.size, np.int32)
        assert _dense_halves(keys, out) == len(first)
        assert out.tolist() == want


def test_numbering_batch_by_batch_gives_the_ids_of_the_whole() -> None:
    """Keys handed over a batch at a time (the sampled curve's parts): every batch's ids are
    the ones a dict gives the concatenation, across the table's growth, an empty batch and
    keys first seen in a later batch."""
    rng = np.random.default_rng(5)
    keys = rng.integers(0, 60_000, 250_000).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    first: dict[int, int] = {}
    want = [first.setdefault(k, len(first)) for k in keys.tolist()]
    numbering = DenseNumbering()
    cuts = [0, 0, 1, 17, 5_000, 5_000, 120_000, keys.size]
    got = [numbering.number(keys[a:b]) for a, b in itertools.pairwise(cuts)]
    assert all(ids.dtype == np.int32 for ids in got)
    assert np.concatenate(got).tolist() == want
    assert numbering.count == len(first)


def test_packed_table_keeps_groups_apart_across_growth() -> None:
    rng = np.random.default_rng(5)
    keys = rng.integers(0, 2**64, 3000, dtype=np.uint64)
    groups = rng.integers(0, 4, 3000)
    # the same key in several groups, and keys that repeat
    keys = np.concatenate([keys, keys[:500], keys[rng.integers(0, 3000, 2000)]])
    groups = np.concatenate([groups, (groups[:500] + 1) % 4, groups[rng.integers(0, 3000, 2000)]])
    shift = row_bits(keys.size)
    table = new_table(0)
    size = table.size
    used = 0
    want: dict[tuple[int, int], int] = {}
    for row, (key, group) in enumerate(zip(keys.tolist(), groups.tolist(), strict=True)):
        slot = table_find(table, np.uint64(key), group, shift)
        if table_set(table, slot, np.uint64(key), group, row, shift):
            used += 1
            table = table_grow_if_full(table, used, shift)
        want[(key, group)] = row
    assert table.size > size  # it grew, several times
    assert used == len(want)
    for (key, group), row in want.items():
        slot = table_find(table, np.uint64(key), group, shift)
        assert table[2 * slot + 1] != 0
        assert table_row(table, slot, shift) == row
    missing = table_find(table, np.uint64(keys[0]), 9, shift)
    assert table[2 * missing + 1] == 0
