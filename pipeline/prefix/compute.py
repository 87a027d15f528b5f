"""Prefix-sharing curve, reuse potential and curve-shape classification.

Both are computed chunk by chunk over the requests in arrival order (the out-of-core path of
:func:`pipeline.prefix.analysis.analyse`): the curve keeps, per window, the one hash each
request that reaches it has there (8 bytes per request and window) and counts the repeats at
the end; the reuse potential is one arrival-order replay of an unbounded cache (a numba kernel
in :mod:`pipeline.prefix.replay`).

Definitions (also in ``docs/prefix.md``)
---------------------------------------
Only requests with ``hashes_known`` take part; count-only requests are reported separately
(``requests_hashes_unknown``) and share nothing. ``B`` is the block size of the hash chain.

*Window grid.* ``W = B·2^j`` for ``j = 0, 1, …`` while ``W`` ≤ the longest prompt (powers of
two when ``B`` is one); at least ``W = B``. Windows below ``B`` or between grid points cannot be
answered from full-block hashes: the chain sees sharing only in whole blocks, so a window that
is not a multiple of ``B`` would be rounded down to one, and ``W < B`` not at all.

*Shared-prefix ratio at W* (docs/decision-rules.md#prefix-sharing): the share of requests whose
first ``W`` prompt tokens are also the first ``W`` prompt tokens of at least one other request (earlier or later). With
chained full-block hashes the first ``W = k·B`` tokens are identified by the hash at block index
``k − 1``, so a request shares at ``W`` when it has ``k`` full prompt blocks and another request
has the same hash at index ``k − 1``. A request whose prompt has fewer than ``k`` full blocks
(prompt shorter than ``W``) cannot share ``W`` tokens: it counts as not sharing in ``share``
and is left out of ``share_eligible`` (the share among requests that reach ``W``). The
token-weighted versions weight each request by its prompt tokens.

*Reuse potential.* Requests in arrival order meet an unbounded prefix cache holding every full
block of every earlier request's prompt and (when hashed) output. A prompt block hits when its
hash occurs in an earlier request's chain; the lookup walks the prompt's blocks from the start
and stops at the first miss (a hash identifies its whole prefix, so the hits are the leading
blocks anyway). Hit tokens = min(hit blocks, ⌊(prompt tokens − 1) / B⌋) × B: the engine
recomputes the last prompt token for the logits and hits are whole blocks, so a fully cached
prompt of exactly k·B tokens hits (k − 1)·B (``pipeline.prefix.cache_rules.hit_limit_blocks``, vLLM's
rule). ``hit_blocks`` itself is not capped. Requests of different ``model`` or ``lora_adapter``
never share a block (vLLM keys every block by its LoRA adapter; models run in separate engines);
the shared-prefix ratio above stays a purely textual measure and ignores them.

*Age of a hit ("last seen").* For a hit block, the time since the most recent earlier request
whose chain (prompt or output) contains that block: the last time any request used or wrote
it. Shallower blocks are last seen at least as recently as deeper ones (every request holding
a deep block holds its prefix), so a cache that keeps each block ``T`` seconds after its last
use (and has no capacity limit) serves exactly the leading blocks whose age is ≤ ``T``. The
per-request age is that of the deepest hit block: how long the cache had to hold it.

*Cross-tenant hits* (when a tenant is logged): a hit block is same-tenant when an earlier
request of the same tenant contains it. Hit tokens under per-tenant isolation are computed
from the same-tenant leading blocks; the rest of the hit tokens were served only because
another tenant sent that prefix (the timing side channel). Requests without a tenant form one
tenant of their own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numba
import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.errors import EnginefitError
from pipeline.prefix.hashmap import (
    TableParts,
    new_table,
    parts_find,
    parts_grow_if_full,
    row_bits,
    splitmix64,
    table_find,
    table_row,
    table_set,
)
from pipeline.prefix.replay import power_of_two_rate, rate_threshold
from pipeline.prefix.sessions import FlatLists
from pipeline.thresholds import (
    CLASSIFY_LONG_WINDOW_TOKENS,
    CLASSIFY_SHORT_WINDOW_TOKENS,
    LONG_CONTEXT_RETENTION,
    PREFIX_LIGHT_SHARE,
)


class PrefixInputError(EnginefitError):
    """The request table cannot be analysed for prefix sharing as given."""


CURVE_SCHEMA: pl.Schema = pl.Schema(
    {
        "window_tokens": pl.Int64,
        "window_blocks": pl.Int64,
        "requests": pl.Int64,
        "eligible": pl.Int64,
        "sharing": pl.Int64,
        "share": pl.Float64,
        "share_eligible": pl.Float64,
        "prompt_tokens": pl.Int64,
        "prompt_tokens_eligible": pl.Int64,
        "prompt_tokens_sharing": pl.Int64,
        "token_share": pl.Float64,
        "token_share_eligible": pl.Float64,
    }
)


# The distinct block sizes of the requests with known hashes (a column "block_size").
KNOWN_BLOCK_SIZES = (
    pl.col("block_size").filter(pl.col("hashes_known").fill_null(False)).drop_nulls().unique()
)


def table_block_size(requests: pl.DataFrame | pl.LazyFrame) -> int | None:
    """The one block size of the requests with known hashes (None when there are none)."""
    return one_block_size(requests.lazy().select(KNOWN_BLOCK_SIZES).collect()["block_size"])


def one_block_size(found: pl.Series) -> int | None:
    """The one block size of :data:`KNOWN_BLOCK_SIZES` (None when there is none)."""
    sizes = found.unique().sort().to_list()
    if not sizes:
        return None
    if len(sizes) > 1:
        raise PrefixInputError(
            f"requests: column 'block_size' holds several block sizes {sizes}; re-ingest the traces "
            "with one block size"
        )
    size = int(sizes[0])
    if size <= 0:
        raise PrefixInputError(f"requests: column 'block_size' must be positive, got {size}")
    return size


def stride_chains(flat: FlatLists, factor: int) -> FlatLists:
    """The chains at ``factor`` times the block size: every ``factor``-th hash."""
    if factor == 1:
        return flat
    coarse = np.diff(flat.offsets) // factor
    offsets = np.zeros(coarse.shape[0] + 1, dtype=np.int64)
    np.cumsum(coarse, out=offsets[1:])
    index = np.repeat(flat.offsets[:-1] + factor - 1 - offsets[:-1] * factor, coarse)
    index += factor * np.arange(int(offsets[-1]), dtype=np.int64)
    nulls = flat.nulls[index] if flat.nulls.shape[0] else flat.nulls
    return FlatLists(offsets=offsets, values=flat.values[index], nulls=nulls)


def analysis_block_size(native: int | None, block_size: int | None) -> tuple[int, int]:
    """The block size to analyse at and its factor over the table's ``native`` one."""
    if native is None:
        return block_size or 1, 1
    if block_size is None or block_size == native:
        return native, 1
    if block_size % native:
        raise PrefixInputError(
            f"block size {block_size} is not a multiple of the table's block size {native}; "
            "coarser analysis strides the hash chain, so it needs a multiple"
        )
    return block_size, block_size // native


def window_grid(block_size: int, max_prompt_tokens: int) -> list[int]:
    """``B·2^j`` for j = 0, 1, … up to ``max_prompt_tokens`` (always at least ``[B]``)."""
    grid = [block_size]
    while grid[-1] * 2 <= max_prompt_tokens:
        grid.append(grid[-1] * 2)
    return grid


@numba.njit(cache=True, nogil=True)  # type: ignore[misc]
def _curve_chunk(
    offsets: npt.NDArray[np.int64],
    values: npt.NDArray[np.uint64],
    nulls: npt.NDArray[np.bool_],
    chain_blocks: npt.NDArray[np.int32],
    known: npt.NDArray[np.bool_],
    prompt_tokens: npt.NDArray[np.int64],
    windows: npt.NDArray[np.int64],
    starts: npt.NDArray[np.int64],
    fill: npt.NDArray[np.int64],
    buf: npt.NDArray[np.uint64],
    tokens: Any,
    null_buf: npt.NDArray[np.bool_],
) -> None:
    """Append, per window ``k`` (ascending), the hash at block ``k - 1`` and the prompt tokens
    of every known row of the chunk with at least ``k`` full prompt blocks to window ``w``'s part
    of ``buf`` and ``tokens`` (``starts[w] + fill[w]``). ``nulls`` (empty = none) marks null
    hashes, copied to ``null_buf``."""
    for i in range(offsets.shape[0] - 1):
        if not known[i]:
            continue
        p = chain_blocks[i]
        for w in range(windows.shape[0]):
            k = windows[w]
            if p < k:
                break
            pos = starts[w] + fill[w]
            buf[pos] = values[offsets[i] + k - 1]
            tokens[pos] = prompt_tokens[i]
            if nulls.shape[0]:
                null_buf[pos] = nulls[offsets[i] + k - 1]
            fill[w] += 1


@numba.njit(cache=True)  # type: ignore[misc]
def _repeated(
    hashes: npt.NDArray[np.uint64], nulls: npt.NDArray[np.bool_], shift: int
) -> npt.NDArray[np.bool_]:
    """Per entry: another entry holds the same hash (nulls, when ``nulls`` is not empty, never
    match)."""
    repeated = np.zeros(hashes.shape[0], dtype=np.bool_)
    table = new_table(hashes.shape[0])
    for i in range(hashes.shape[0]):
        if nulls.shape[0] and nulls[i]:
            continue
        slot = table_find(table, hashes[i], 0, shift)
        if table[2 * slot + 1] == 0:
            table_set(table, slot, hashes[i], 0, i, shift)
        else:
            repeated[table_row(table, slot, shift)] = True
            repeated[i] = True
    return repeated


# Per-window hashes the curve keeps exactly (12 bytes each with the request's prompt tokens:
# 805 MB). A generated 10M-request trace needs 31.5M (Mooncake form, 512-token blocks) or 58.2M
# (16-token blocks); past the budget the curve is a SHARDS-style estimate.
DEFAULT_CURVE_HASH_BUDGET = 1 << 26
# A sampled curve keeps about budget / SAMPLED_SHARE hashes: each distinct kept (window, hash)
# costs ~45 bytes (a table entry, its count and tokens), so the sample's memory stays under the
# exact curve's at the budget.
SAMPLED_SHARE = 8
# Bits of a sampled class's index in the kept-classes table (its window is the group).
_CLASS_BITS = 40


@numba.njit(cache=True, nogil=True)  # type: ignore[misc]
def _curve_sample_chunk(
    offsets: npt.NDArray[np.int64],
    values: npt.NDArray[np.uint64],
    nulls: npt.NDArray[np.bool_],
    chain_blocks: npt.NDArray[np.int32],
    known: npt.NDArray[np.bool_],
    prompt_tokens: npt.NDArray[np.int64],
    windows: npt.NDArray[np.int64],
    threshold: np.uint64,
    owners: Any,
    addresses: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    used: npt.NDArray[np.int64],
    class_count: npt.NDArray[np.int64],
    class_tokens: npt.NDArray[np.int64],
    class_window: npt.NDArray[np.int32],
    n_classes: int,
    null_count: npt.NDArray[np.int64],
    null_tokens: npt.NDArray[np.int64],
) -> int:
    """:func:`_curve_chunk` counting only the hashes whose ``splitmix64`` falls below
    ``threshold`` (every entry of a hash or none), per (window, hash) class: its entries and
    their prompt tokens (``class_*``, the class found in a table in parts keyed by the hash with
    the window as group); null hashes (they never share) are counted per window. Returns the
    classes so far."""
    for i in range(offsets.shape[0] - 1):
        if not known[i]:
            continue
        p = chain_blocks[i]
        for w in range(windows.shape[0]):
            k = windows[w]
            if p < k:
                break
            at = offsets[i] + k - 1
            if nulls.shape[0] and nulls[at]:
                null_count[w] += 1
                null_tokens[w] += prompt_tokens[i]
                continue
            key = values[at]
            if splitmix64(key) >= threshold:
                continue
            part, table, slot = parts_find(addresses, lengths, key, w, _CLASS_BITS)
            if table[2 * slot + 1] == 0:
                c = n_classes
                n_classes += 1
                class_window[c] = w
                table_set(table, slot, key, w, c, _CLASS_BITS)
                used[part] += 1
                parts_grow_if_full(owners, addresses, lengths, used, part, _CLASS_BITS)
            else:
                c = table_row(table, slot, _CLASS_BITS)
            class_count[c] += 1
            class_tokens[c] += prompt_tokens[i]
    return n_classes


class CurveCounter:
    """The shared-prefix curve fed chunk by chunk (each chunk's rows in order, each row once).

    ``reach`` (distinct full prompt blocks and how many known requests have each, as the table
    states them before the chains are read: an upper bound of what the chains hold) sizes the
    buffers and decides exact or sampled; each chunk's ``chain_blocks`` (the blocks its chains
    hold) must be final when it is fed.

    Exact while the per-window hashes (one per request and window it reaches) number at most
    ``budget``: each with its request's prompt tokens, and the repeats counted at the end.
    Past it, SHARDS-style spatial sampling (Waldspurger et al., FAST '15): a hash is kept when
    ``splitmix64(hash) < rate · 2^64`` with ``rate`` the power of two nearest to budget /
    (SAMPLED_SHARE × hashes) (:func:`curve_rate`: it stays put while the table grows by days), so
    every request holding a kept hash is kept with it and "another request holds it too" is
    decided exactly among the kept ones; the kept hashes are counted per (window, hash) class,
    so memory follows the kept classes, however many requests share one. ``sharing`` and
    ``prompt_tokens_sharing`` are then the kept shares times the exact eligible counts
    (:meth:`_ratio_estimate`); ``standard_errors`` holds each window's standard error of
    ``sharing``. ``rate`` is 1.0 when exact.
    """

    def __init__(
        self,
        block_size: int,
        max_prompt_tokens: int,
        reach: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]],
        budget: int = DEFAULT_CURVE_HASH_BUDGET,
    ) -> None:
        self.block_size = block_size
        self.grid = window_grid(block_size, max_prompt_tokens)
        self.windows = np.array([w // block_size for w in self.grid], dtype=np.int64)
        bounds = window_reach(self.windows, reach)
        total = int(sum(bounds))
        self.hashes = total
        self.rate = curve_rate(total, budget)
        self.standard_errors = [0.0] * len(self.grid)
        n_windows = len(self.grid)
        # exact per-window totals, fed chunk by chunk in either mode
        self.requests = 0
        self.tokens = 0
        self.eligible = np.zeros(n_windows, np.int64)
        self.eligible_tokens = np.zeros(n_windows, np.int64)
        if self.rate < 1.0:
            self._threshold = rate_threshold(self.rate)
            self._classes = TableParts(64)
            self._n_classes = 0
            self._class_count = np.zeros(0, np.int64)
            self._class_tokens = np.zeros(0, np.int64)
            self._class_window = np.zeros(0, np.int32)
            self._null_count = np.zeros(n_windows, np.int64)
            self._null_tokens = np.zeros(n_windows, np.int64)
            bounds = [0] * n_windows
        self.starts = np.concatenate([[0], np.cumsum(bounds)]).astype(np.int64)
        self.fill = np.zeros(n_windows, dtype=np.int64)
        self.buf = np.empty(int(self.starts[-1]), dtype=np.uint64)
        # prompts of at most 2^31 - 1 tokens (every trace's) take 4 bytes an entry
        small = max_prompt_tokens < 2**31
        self.buf_tokens = np.empty(self.buf.shape[0], dtype=np.int32 if small else np.int64)
        self.null_buf = np.zeros(0, dtype=np.bool_)

    def feed(
        self,
        offsets: npt.NDArray[np.int64],
        values: npt.NDArray[np.uint64],
        nulls: npt.NDArray[np.bool_],
        known: npt.NDArray[np.bool_],
        chain_blocks: npt.NDArray[np.int32],
        prompt_tokens: npt.NDArray[np.int64],
    ) -> None:
        """A chunk's rows: their chains (``offsets``, ``values``, ``nulls``) and per row whether
        its hashes are known, its full prompt blocks in the chain and its prompt tokens."""
        self.requests += int(np.count_nonzero(known))
        self.tokens += int(prompt_tokens[known].sum())
        reach = np.zeros(self.windows.shape[0], np.int64)
        for w, k in enumerate(self.windows.tolist()):
            reaching = known & (chain_blocks >= k)
            reach[w] = np.count_nonzero(reaching)
            self.eligible[w] += int(reach[w])
            self.eligible_tokens[w] += int(prompt_tokens[reaching].sum())
        if self.rate < 1.0:
            # room for a new class per entry the chunk can add
            need = self._n_classes + (offsets.shape[0] - 1) * self.windows.shape[0]
            if self._class_count.shape[0] < need:
                size = max(need, self._class_count.shape[0] * 3 // 2)
                self._class_count = _grown(self._class_count, size)
                self._class_tokens = _grown(self._class_tokens, size)
                self._class_window = _grown(self._class_window, size)
            self._n_classes = _curve_sample_chunk(
                offsets,
                values,
                nulls,
                chain_blocks,
                known,
                prompt_tokens,
                self.windows,
                self._threshold,
                self._classes.owners,
                self._classes.addresses,
                self._classes.lengths,
                self._classes.used,
                self._class_count,
                self._class_tokens,
                self._class_window,
                self._n_classes,
                self._null_count,
                self._null_tokens,
            )
            return
        self._make_room(reach)
        if nulls.shape[0] and self.null_buf.shape[0] == 0:
            self.null_buf = np.zeros(self.buf.shape[0], dtype=np.bool_)
        _curve_chunk(
            offsets,
            values,
            nulls,
            chain_blocks,
            known,
            prompt_tokens,
            self.windows,
            self.starts,
            self.fill,
            self.buf,
            self.buf_tokens,
            self.null_buf,
        )

    def widen(self, max_prompt_tokens: int) -> None:
        """The windows of a table whose longest prompt is now ``max_prompt_tokens``: a pass
        carried on to later days (:mod:`pipeline.prefix.days`) that meets a longer prompt.
        Exact: every request fed before was shorter than each new window, so reached none."""
        grid = window_grid(self.block_size, max_prompt_tokens)
        added = len(grid) - len(self.grid)
        if added <= 0:
            return
        self.grid = grid
        self.windows = np.array([w // self.block_size for w in grid], dtype=np.int64)
        self.standard_errors += [0.0] * added
        self.eligible = np.concatenate([self.eligible, np.zeros(added, np.int64)])
        self.eligible_tokens = np.concatenate([self.eligible_tokens, np.zeros(added, np.int64)])
        self.fill = np.concatenate([self.fill, np.zeros(added, np.int64)])
        self.starts = np.concatenate([self.starts, np.full(added, self.starts[-1], np.int64)])
        if self.rate < 1.0:
            self._null_count = np.concatenate([self._null_count, np.zeros(added, np.int64)])
            self._null_tokens = np.concatenate([self._null_tokens, np.zeros(added, np.int64)])

    def _make_room(self, adding: npt.NDArray[np.int64]) -> None:
        """Room for ``adding`` more entries of each window: the buffers sized from ``reach``
        hold every chunk of the table they were sized for; a pass carried on to later days
        (:mod:`pipeline.prefix.days`) grows them, each full window by half or what it needs."""
        room = np.diff(self.starts) - self.fill
        if bool((adding <= room).all()):
            return
        size = np.diff(self.starts)
        short = adding > room
        size[short] = np.maximum(self.fill[short] + adding[short], size[short] * 3 // 2)
        starts = np.concatenate([[0], np.cumsum(size)]).astype(np.int64)
        buf = np.empty(int(starts[-1]), dtype=self.buf.dtype)
        tokens = np.empty(buf.shape[0], dtype=self.buf_tokens.dtype)
        nulls = np.zeros(buf.shape[0] if self.null_buf.shape[0] else 0, dtype=np.bool_)
        for w in range(size.shape[0]):
            old, new, used = int(self.starts[w]), int(starts[w]), int(self.fill[w])
            buf[new : new + used] = self.buf[old : old + used]
            tokens[new : new + used] = self.buf_tokens[old : old + used]
            if nulls.shape[0]:
                nulls[new : new + used] = self.null_buf[old : old + used]
        self.starts, self.buf, self.buf_tokens, self.null_buf = starts, buf, tokens, nulls

    def nbytes(self) -> int:
        """Bytes its buffers or kept classes hold."""
        if self.rate < 1.0:
            arrays = (self._class_count, self._class_tokens, self._class_window)
            return self._classes.nbytes() + sum(a.nbytes for a in arrays)
        return self.buf.nbytes + self.buf_tokens.nbytes + self.null_buf.nbytes

    def finish(self) -> pl.DataFrame:
        """The curve (one row per window); the buffers are released window by window."""
        if self.rate < 1.0:
            return self._finish_sampled()
        rows = []
        for w, (window, k) in enumerate(zip(self.grid, self.windows.tolist(), strict=True)):
            lo, hi = int(self.starts[w]), int(self.starts[w]) + int(self.fill[w])
            nulls = self.null_buf[lo:hi] if self.null_buf.shape[0] else self.null_buf
            repeated = _repeated(self.buf[lo:hi], nulls, row_bits(hi - lo))
            tokens = self.buf_tokens[lo:hi]
            rows.append(
                (
                    window,
                    k,
                    self.requests,
                    hi - lo,
                    int(np.count_nonzero(repeated)),
                    self.tokens,
                    int(tokens.sum(dtype=np.int64)),
                    int(tokens[repeated].sum(dtype=np.int64)),
                )
            )
            del repeated
        self.buf = np.empty(0, dtype=np.uint64)
        self.buf_tokens = np.empty(0, dtype=np.int32)
        self.null_buf = np.zeros(0, dtype=np.bool_)
        return curve_frame(rows)

    def _finish_sampled(self) -> pl.DataFrame:
        n = self._n_classes
        window_of = self._class_window[:n]
        order = np.argsort(window_of, kind="stable")
        cuts = np.searchsorted(window_of[order], np.arange(len(self.grid) + 1))
        counts, tokens = self._class_count[:n][order], self._class_tokens[:n][order]
        self._classes = TableParts(1)
        rows = []
        for w, (window, k) in enumerate(zip(self.grid, self.windows.tolist(), strict=True)):
            sharing, sharing_tokens, error = self._ratio_estimate(
                counts[cuts[w] : cuts[w + 1]],
                tokens[cuts[w] : cuts[w + 1]],
                int(self.eligible[w] - self._null_count[w]),
                int(self.eligible_tokens[w] - self._null_tokens[w]),
            )
            self.standard_errors[w] = error
            rows.append(
                (
                    window,
                    k,
                    self.requests,
                    int(self.eligible[w]),
                    sharing,
                    self.tokens,
                    int(self.eligible_tokens[w]),
                    sharing_tokens,
                )
            )
        return curve_frame(rows)

    def _ratio_estimate(
        self,
        sizes: npt.NDArray[np.int64],
        class_tokens: npt.NDArray[np.int64],
        population: int,
        population_tokens: int,
    ) -> tuple[int, int, float]:
        """Sharing requests and their prompt tokens among ``population`` non-null entries (of
        ``population_tokens``) from the kept classes (entries and prompt tokens per kept hash),
        and the standard error of the first.

        The share among the kept entries (a ratio over kept hash classes) scales to the known
        population: SHARDS's adjustment to the sampled count (Waldspurger et al., FAST '15,
        "SHARDS_adj"), which is exact when every kept class shares (a window where everyone
        starts with one of a few system prompts). Its standard error is the cluster-sampling
        ratio estimator's (Cochran, *Sampling Techniques*, 3rd ed., §6.7 and §11.8):
        √((1 − rate) · Σ c² (s_c − ρ)²) / rate over the kept classes of c entries, s_c = 1
        when c ≥ 2, ρ the kept share."""
        kept = int(sizes.sum())
        if kept == 0 or population <= 0:
            return 0, 0, 0.0
        shares = sizes >= 2
        share = int(sizes[shares].sum()) / kept
        tokens = int(class_tokens.sum())
        sharing_tokens = int(class_tokens[shares].sum())
        token_share = sharing_tokens / tokens if tokens else 0.0
        c = sizes.astype(np.float64)
        spread = float(np.sum(c * c * (shares - share) ** 2))
        error = math.sqrt((1.0 - self.rate) * spread) / self.rate
        return round(share * population), round(token_share * population_tokens), error


def window_reach(
    windows: npt.NDArray[np.int64], reach: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]
) -> list[int]:
    """Per window (in blocks), the known requests that reach it, from ``reach`` (distinct full
    prompt blocks and how many requests have each): the curve's per-window hashes."""
    blocks, counts = reach
    return [int(counts[blocks >= k].sum()) for k in windows.tolist()]


def curve_rate(hashes: int, budget: int) -> float:
    """The curve's sample rate for ``hashes`` per-window hashes under ``budget``: 1.0 when they
    fit, else the power of two nearest to budget / (SAMPLED_SHARE × hashes)
    (:func:`pipeline.prefix.replay.power_of_two_rate`), so a table growing by days keeps its
    rate until its hashes double."""
    if hashes <= budget:
        return 1.0
    return power_of_two_rate(max(budget // SAMPLED_SHARE, 1) / hashes)


def _grown(array: npt.NDArray[Any], size: int) -> npt.NDArray[Any]:
    grown = np.zeros(size, dtype=array.dtype)
    grown[: array.shape[0]] = array
    return grown


def curve_frame(rows: Sequence[tuple[Any, ...]]) -> pl.DataFrame:
    """The curve from per-window counts (window_tokens, window_blocks, requests, eligible,
    sharing, prompt_tokens, prompt_tokens_eligible, prompt_tokens_sharing)."""
    names = [
        "window_tokens",
        "window_blocks",
        "requests",
        "eligible",
        "sharing",
        "prompt_tokens",
        "prompt_tokens_eligible",
        "prompt_tokens_sharing",
    ]
    return (
        pl.DataFrame(rows, schema=dict.fromkeys(names, pl.Int64), orient="row")
        .with_columns(
            _ratio("sharing", "requests").alias("share"),
            _ratio("sharing", "eligible").alias("share_eligible"),
            _ratio("prompt_tokens_sharing", "prompt_tokens").alias("token_share"),
            _ratio("prompt_tokens_sharing", "prompt_tokens_eligible").alias("token_share_eligible"),
        )
        .select(CURVE_SCHEMA.names())
        .cast(CURVE_SCHEMA)
        .sort("window_tokens")
    )


def _ratio(num: str, den: str) -> pl.Expr:
    return pl.when(pl.col(den) > 0).then(pl.col(num) / pl.col(den)).otherwise(None)


def classify_curve(curve: pl.DataFrame, median_prompt_tokens: float | None) -> dict[str, Any]:
    """Shape of the sharing curve, with the numbers behind it.

    ``short`` = the smallest grid window ≥ ``CLASSIFY_SHORT_WINDOW_TOKENS`` (or the largest
    window when every prompt is shorter); ``long`` = the largest grid window ≤
    min(``CLASSIFY_LONG_WINDOW_TOKENS``, median prompt tokens), if it is above ``short``. Both use
    ``share_eligible`` (requests that reach the window), so short prompts do not read as short
    sharing. ``no sharing`` when share(short) < ``PREFIX_LIGHT_SHARE``; else ``long shared
    context`` when share(long) / share(short) ≥ ``LONG_CONTEXT_RETENTION``; else ``short system
    prompt``. Without a long window (median prompt ≤ short window) the shape is ``short system
    prompt`` when sharing exists (prompts are too short to carry long shared context).
    """
    thresholds = {
        "short_window_tokens": CLASSIFY_SHORT_WINDOW_TOKENS,
        "long_window_tokens": CLASSIFY_LONG_WINDOW_TOKENS,
        "no_sharing_below": PREFIX_LIGHT_SHARE,
        "long_context_retention": LONG_CONTEXT_RETENTION,
    }
    windows = curve.filter(pl.col("eligible") > 0)
    if windows.height == 0:
        return {
            "shape": "unknown",
            "reason": "no request has a full block with known hashes",
            "short_window_tokens": None,
            "long_window_tokens": None,
            "share_short": None,
            "share_long": None,
            "retention": None,
            "thresholds": thresholds,
        }
    grid = windows["window_tokens"].to_list()
    short = next((w for w in grid if w >= CLASSIFY_SHORT_WINDOW_TOKENS), grid[-1])
    cap = min(CLASSIFY_LONG_WINDOW_TOKENS, median_prompt_tokens or 0)
    long_candidates = [w for w in grid if short < w <= cap]
    long = long_candidates[-1] if long_candidates else None

    def share_at(w: int) -> float:
        value = windows.filter(pl.col("window_tokens") == w)["share_eligible"].item()
        return float(value or 0.0)

    s_short = share_at(short)
    s_long = share_at(long) if long is not None else None
    retention = s_long / s_short if s_long is not None and s_short > 0 else None
    if s_short < PREFIX_LIGHT_SHARE:
        shape = "no sharing"
        reason = f"share at {short} tokens {s_short:.1%} < {PREFIX_LIGHT_SHARE:.0%}"
    elif retention is not None and retention >= LONG_CONTEXT_RETENTION:
        shape = "long shared context"
        reason = (
            f"share at {long} tokens is {retention:.0%} of the share at {short} tokens "
            f"(≥ {LONG_CONTEXT_RETENTION:.0%})"
        )
    elif retention is None:
        shape = "short system prompt"
        reason = f"median prompt too short for a long window above {short} tokens"
    else:
        shape = "short system prompt"
        reason = (
            f"share at {long} tokens is only {retention:.0%} of the share at {short} tokens "
            f"(< {LONG_CONTEXT_RETENTION:.0%})"
        )
    return {
        "shape": shape,
        "reason": reason,
        "short_window_tokens": short,
        "long_window_tokens": long,
        "share_short": s_short,
        "share_long": s_long,
        "retention": retention,
        "thresholds": thresholds,
    }
