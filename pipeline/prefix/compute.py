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
from pipeline.prefix.cache_rules import hit_limit_blocks, namespace_codes
from pipeline.prefix.hashmap import (
    new_table,
    row_bits,
    splitmix64,
    table_find,
    table_row,
    table_set,
)
from pipeline.prefix.replay import Replay
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


def table_block_size(requests: pl.DataFrame | pl.LazyFrame) -> int | None:
    """The one block size of the requests with known hashes (None when there are none)."""
    sizes = (
        requests.lazy()
        .filter(pl.col("hashes_known").fill_null(False))
        .select(pl.col("block_size").drop_nulls().unique().sort())
        .collect()["block_size"]
        .to_list()
    )
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
    row0: int,
    chain_blocks: npt.NDArray[np.int32],
    known: npt.NDArray[np.bool_],
    windows: npt.NDArray[np.int64],
    starts: npt.NDArray[np.int64],
    fill: npt.NDArray[np.int64],
    buf: npt.NDArray[np.uint64],
    null_buf: npt.NDArray[np.bool_],
) -> None:
    """Append, per window ``k`` (ascending), the hash at block ``k - 1`` of every known row of
    the chunk with at least ``k`` full prompt blocks to window ``w``'s part of ``buf``
    (``starts[w] + fill[w]``). ``nulls`` (empty = none) marks null hashes, copied to
    ``null_buf``."""
    for i in range(offsets.shape[0] - 1):
        r = row0 + i
        if not known[r]:
            continue
        p = chain_blocks[r]
        for w in range(windows.shape[0]):
            k = windows[w]
            if p < k:
                break
            pos = starts[w] + fill[w]
            buf[pos] = values[offsets[i] + k - 1]
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


# Per-window hashes the curve keeps exactly (8 bytes each: 1 GiB). A generated 10M-request trace
# at 16-token blocks needs 58.2M; past the budget the curve is a SHARDS-style estimate.
DEFAULT_CURVE_HASH_BUDGET = 1 << 27


@numba.njit(cache=True, nogil=True)  # type: ignore[misc]
def _curve_sample_chunk(
    offsets: npt.NDArray[np.int64],
    values: npt.NDArray[np.uint64],
    nulls: npt.NDArray[np.bool_],
    row0: int,
    chain_blocks: npt.NDArray[np.int32],
    known: npt.NDArray[np.bool_],
    windows: npt.NDArray[np.int64],
    threshold: np.uint64,
    hashes: npt.NDArray[np.uint64],
    rows: npt.NDArray[np.int64],
    window_of: npt.NDArray[np.int64],
) -> int:
    """:func:`_curve_chunk` keeping only the hashes whose ``splitmix64`` falls below
    ``threshold`` (every entry of a hash or none): their hash, row and window go to
    ``hashes``, ``rows``, ``window_of``; null hashes (they never share) are all kept, with
    window ``-1 - w``. Returns how many."""
    m = 0
    for i in range(offsets.shape[0] - 1):
        r = row0 + i
        if not known[r]:
            continue
        p = chain_blocks[r]
        for w in range(windows.shape[0]):
            k = windows[w]
            if p < k:
                break
            at = offsets[i] + k - 1
            if nulls.shape[0] and nulls[at]:
                hashes[m] = 0
                rows[m] = r
                window_of[m] = -1 - w
                m += 1
            elif splitmix64(values[at]) < threshold:
                hashes[m] = values[at]
                rows[m] = r
                window_of[m] = w
                m += 1
    return m


class CurveCounter:
    """The shared-prefix curve fed chunk by chunk (rows in order, each once).

    ``chain_blocks`` (per request: full prompt blocks its chain holds) must be final for a
    chunk's rows when the chunk is fed; ``upper_blocks`` bounds it from above before the pass
    (it sizes the buffers).

    Exact while the per-window hashes (one per request and window it reaches) number at most
    ``budget``. Past it, SHARDS-style spatial sampling (Waldspurger et al., FAST '15): a hash
    is kept when ``splitmix64(hash) < rate · 2^64`` with ``rate`` = budget / 2 over the hashes
    (hash and row kept: 16 bytes each, the budget's 8 bytes a hash), so every request holding
    a kept hash is kept with it and "another request holds it too" is decided exactly among the
    kept ones. ``sharing`` and ``prompt_tokens_sharing`` are then the kept shares times the
    exact eligible counts (:meth:`_ratio_estimate`); ``standard_errors`` holds each window's
    standard error of ``sharing``. ``rate`` is 1.0 when exact.
    """

    def __init__(
        self,
        block_size: int,
        max_prompt_tokens: int,
        known: npt.NDArray[np.bool_],
        upper_blocks: npt.NDArray[np.int32],
        budget: int = DEFAULT_CURVE_HASH_BUDGET,
    ) -> None:
        self.block_size = block_size
        self.grid = window_grid(block_size, max_prompt_tokens)
        self.windows = np.array([w // block_size for w in self.grid], dtype=np.int64)
        self.known = known
        bounds = [int(np.count_nonzero(known & (upper_blocks >= k))) for k in self.windows]
        total = int(sum(bounds))
        self.hashes = total
        self.rate = 1.0 if total <= budget else max(budget // 2, 1) / total
        self.standard_errors = [0.0] * len(self.grid)
        self._threshold = np.uint64(min(int(self.rate * 2.0**64), 2**64 - 1))
        self._kept: list[
            tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64], npt.NDArray[np.int64]]
        ] = []
        if self.rate < 1.0:
            bounds = [0] * len(bounds)
        self.starts = np.concatenate([[0], np.cumsum(bounds)]).astype(np.int64)
        self.fill = np.zeros(self.windows.shape[0], dtype=np.int64)
        self.buf = np.empty(int(self.starts[-1]), dtype=np.uint64)
        self.null_buf = np.zeros(0, dtype=np.bool_)

    def feed(
        self,
        row0: int,
        offsets: npt.NDArray[np.int64],
        values: npt.NDArray[np.uint64],
        nulls: npt.NDArray[np.bool_],
        chain_blocks: npt.NDArray[np.int32],
    ) -> None:
        if self.rate < 1.0:
            rows = offsets.shape[0] - 1
            size = rows * self.windows.shape[0]
            hashes = np.empty(size, dtype=np.uint64)
            kept_rows = np.empty(size, dtype=np.int64)
            window_of = np.empty(size, dtype=np.int64)
            m = _curve_sample_chunk(
                offsets,
                values,
                nulls,
                row0,
                chain_blocks,
                self.known,
                self.windows,
                self._threshold,
                hashes,
                kept_rows,
                window_of,
            )
            self._kept.append((hashes[:m].copy(), kept_rows[:m].copy(), window_of[:m].copy()))
            return
        if nulls.shape[0] and self.null_buf.shape[0] == 0:
            self.null_buf = np.zeros(self.buf.shape[0], dtype=np.bool_)
        _curve_chunk(
            offsets,
            values,
            nulls,
            row0,
            chain_blocks,
            self.known,
            self.windows,
            self.starts,
            self.fill,
            self.buf,
            self.null_buf,
        )

    def finish(
        self, prompt_tokens: npt.NDArray[np.int64], chain_blocks: npt.NDArray[np.int32]
    ) -> pl.DataFrame:
        """The curve (one row per window); the buffers are released window by window."""
        if self.rate < 1.0:
            return self._finish_sampled(prompt_tokens, chain_blocks)
        known_tokens = prompt_tokens[self.known]
        rows = []
        for w, (window, k) in enumerate(zip(self.grid, self.windows.tolist(), strict=True)):
            lo, hi = int(self.starts[w]), int(self.starts[w]) + int(self.fill[w])
            nulls = self.null_buf[lo:hi] if self.null_buf.shape[0] else self.null_buf
            repeated = _repeated(self.buf[lo:hi], nulls, row_bits(hi - lo))
            eligible_tokens = prompt_tokens[self.known & (chain_blocks >= k)]
            rows.append(
                (
                    window,
                    k,
                    known_tokens.shape[0],
                    hi - lo,
                    int(np.count_nonzero(repeated)),
                    int(known_tokens.sum()),
                    int(eligible_tokens.sum()),
                    int(eligible_tokens[repeated].sum()),
                )
            )
            del repeated, eligible_tokens
        self.buf = np.empty(0, dtype=np.uint64)
        self.null_buf = np.zeros(0, dtype=np.bool_)
        return curve_frame(rows)

    def _finish_sampled(
        self, prompt_tokens: npt.NDArray[np.int64], chain_blocks: npt.NDArray[np.int32]
    ) -> pl.DataFrame:
        hashes = np.concatenate([h for h, _, _ in self._kept] or [np.zeros(0, np.uint64)])
        rows_of = np.concatenate([r for _, r, _ in self._kept] or [np.zeros(0, np.int64)])
        window_of = np.concatenate([w for _, _, w in self._kept] or [np.zeros(0, np.int64)])
        self._kept = []
        order = np.argsort(window_of, kind="stable")
        hashes, rows_of, window_of = hashes[order], rows_of[order], window_of[order]
        n_windows = len(self.grid)
        cuts = np.searchsorted(window_of, np.arange(n_windows + 1))
        null_cuts = np.searchsorted(window_of, -1 - np.arange(n_windows + 1), side="right")
        known_tokens = prompt_tokens[self.known]
        rows = []
        for w, (window, k) in enumerate(zip(self.grid, self.windows.tolist(), strict=True)):
            eligible = self.known & (chain_blocks >= k)
            n_eligible = int(np.count_nonzero(eligible))
            eligible_tokens = int(prompt_tokens[eligible].sum())
            null_rows = rows_of[null_cuts[w + 1] : null_cuts[w]]
            sharing, sharing_tokens, error = self._ratio_estimate(
                hashes[cuts[w] : cuts[w + 1]],
                prompt_tokens[rows_of[cuts[w] : cuts[w + 1]]],
                n_eligible - null_rows.shape[0],
                eligible_tokens - int(prompt_tokens[null_rows].sum()),
            )
            self.standard_errors[w] = error
            rows.append(
                (
                    window,
                    k,
                    known_tokens.shape[0],
                    n_eligible,
                    sharing,
                    int(known_tokens.sum()),
                    eligible_tokens,
                    sharing_tokens,
                )
            )
        return curve_frame(rows)

    def _ratio_estimate(
        self,
        kept: npt.NDArray[np.uint64],
        kept_tokens: npt.NDArray[np.int64],
        population: int,
        population_tokens: int,
    ) -> tuple[int, int, float]:
        """Sharing requests and their prompt tokens among ``population`` non-null entries (of
        ``population_tokens``) from the kept ones, and the standard error of the first.

        The share among the kept entries (a ratio over kept hash classes) scales to the known
        population: SHARDS's adjustment to the sampled count (Waldspurger et al., FAST '15,
        "SHARDS_adj"), which is exact when every kept class shares (a window where everyone
        starts with one of a few system prompts). Its standard error is the cluster-sampling
        ratio estimator's (Cochran, *Sampling Techniques*, 3rd ed., §6.7 and §11.8):
        √((1 − rate) · Σ c² (s_c − ρ)²) / rate over the kept classes of c entries, s_c = 1
        when c ≥ 2, ρ the kept share."""
        if kept.shape[0] == 0 or population <= 0:
            return 0, 0, 0.0
        _, inverse, sizes = np.unique(kept, return_inverse=True, return_counts=True)
        shares = sizes >= 2
        sharing_entries = int(sizes[shares].sum())
        share = sharing_entries / kept.shape[0]
        tokens = int(kept_tokens.sum())
        sharing_tokens = int(kept_tokens[shares[inverse]].sum())
        token_share = sharing_tokens / tokens if tokens else 0.0
        c = sizes.astype(np.float64)
        spread = float(np.sum(c * c * (shares - share) ** 2))
        error = math.sqrt((1.0 - self.rate) * spread) / self.rate
        return round(share * population), round(token_share * population_tokens), error


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


def _bucket_col(seconds: float) -> str:
    return f"hit_tokens_within_{seconds:g}s"


def reuse_groups(
    requests: pl.DataFrame, n: int, shift: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64] | None]:
    """The replays' groups of ``requests`` (``model``, ``lora_adapter``, ``tenant``; other
    columns ignored): the shared replay's (model, LoRA adapter) namespace (empty when there is
    one), and the same-tenant replay's (namespace, tenant) (None when no tenant is logged;
    a null tenant is the tenant "")."""
    namespace = namespace_codes(requests) if n else np.zeros(0, np.int64)
    several = namespace.size > 0 and int(namespace.max()) > 0
    tenant: npt.NDArray[np.int64] | None = None
    if "tenant" in requests.columns and requests["tenant"].null_count() < n:
        code = requests["tenant"].fill_null("").rank("dense").cast(pl.Int64).to_numpy()
        if several:
            code = namespace * (int(code.max()) + 1) + code
            code = pl.Series(code).rank("dense").cast(pl.Int64).to_numpy()
        tenant = code - 1
    groups = [g for g in (namespace if several else None, tenant) if g is not None]
    if groups and max(int(g.max()) for g in groups) >= 1 << (63 - shift):
        raise PrefixInputError(f"{n} requests: too many for the prefix replay's packed table")
    return (namespace if several else np.zeros(0, np.int64)), tenant


def reuse_frame(
    known: npt.NDArray[np.bool_],
    prompt_tokens: npt.NDArray[np.int64],
    chain_blocks: npt.NDArray[np.int32],
    shared: Replay,
    same_tenant: Replay | None,
    block_size: int,
    age_buckets_s: tuple[float, ...],
) -> pl.DataFrame:
    """Per request (in arrival order), from finished replays: what an unbounded prefix cache
    could serve, how long ago the hit prefix was last seen, and the same-tenant part.

    Columns: ``row`` (input row), ``hashes_known``, ``prompt_tokens``, ``prompt_blocks``, ``hit_blocks``,
    ``hit_tokens``, ``hit_tokens_within_<T>s`` for each retention ``T``, ``last_seen_age_s``
    (age of the deepest hit block; null without a hit), ``hit_tokens_same_tenant`` (null when
    no tenant is logged).
    """
    n = known.shape[0]
    columns: dict[str, object] = {
        "row": np.arange(n, dtype=np.int64),
        "hashes_known": known,
        "prompt_tokens": prompt_tokens,
        "prompt_blocks": chain_blocks.astype(np.int64),
        "hit_blocks": shared.hit.astype(np.int64),
        "last_seen_age_s": np.where(shared.age >= 0, shared.age / 1e6, np.nan),
    }
    for i in range(len(age_buckets_s)):
        columns[f"_blocks_{i}"] = shared.within[:, i]
    if same_tenant is not None:
        columns["_blocks_same"] = same_tenant.hit
    else:
        columns["_blocks_same"] = pl.Series([None] * n, dtype=pl.Int64)
    columns["_limit"] = hit_limit_blocks(prompt_tokens, block_size)
    base = pl.DataFrame(columns).with_columns(pl.col("last_seen_age_s").fill_nan(None))
    del columns

    def tokens(blocks_col: str) -> pl.Expr:
        return pl.min_horizontal(pl.col(blocks_col).fill_null(0), pl.col("_limit")) * block_size

    return base.select(
        pl.col("row").cast(pl.Int64),
        "hashes_known",
        "prompt_tokens",
        "prompt_blocks",
        "hit_blocks",
        tokens("hit_blocks").alias("hit_tokens"),
        *[tokens(f"_blocks_{i}").alias(_bucket_col(t)) for i, t in enumerate(age_buckets_s)],
        "last_seen_age_s",
        pl.when(pl.lit(same_tenant is not None))
        .then(tokens("_blocks_same"))
        .otherwise(None)
        .cast(pl.Int64)
        .alias("hit_tokens_same_tenant"),
    )


def new_replays(
    arrival_us: npt.NDArray[np.int64],
    known: npt.NDArray[np.bool_],
    chain_blocks: npt.NDArray[np.int32],
    groups: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64] | None],
    shift: int,
    age_buckets_s: tuple[float, ...],
) -> tuple[Replay, Replay | None]:
    """The shared replay (with ages) and, when tenants are logged, the same-tenant one."""
    n = known.shape[0]
    buckets_us = np.array([t * 1e6 for t in age_buckets_s], dtype=np.float64)
    namespace, tenant = groups
    shared = Replay(n, shift, chain_blocks, known, arrival_us, namespace, buckets_us, with_age=True)
    same = (
        Replay(n, shift, chain_blocks, known, arrival_us, tenant, buckets_us, with_age=False)
        if tenant is not None
        else None
    )
    return shared, same


def reuse_summary(per_request: pl.DataFrame, age_buckets_s: tuple[float, ...]) -> dict[str, Any]:
    """Totals of :func:`reuse_frame` over the requests with known hashes: hit tokens and
    shares, by retention and tenant."""
    sums = (
        per_request.filter(pl.col("hashes_known"))
        .select(
            pl.len().alias("requests"),
            pl.col("prompt_tokens").sum(),
            pl.col("prompt_blocks").sum(),
            pl.col("hit_blocks").sum(),
            pl.col("hit_tokens").sum(),
            (pl.col("hit_blocks") > 0).sum().alias("requests_with_hit"),
            *[pl.col(_bucket_col(t)).sum() for t in age_buckets_s],
            pl.col("hit_tokens_same_tenant").sum(),
            pl.col("hit_tokens_same_tenant").is_not_null().any().alias("tenants_logged"),
        )
        .row(0, named=True)
    )
    prompt_tokens = int(sums["prompt_tokens"] or 0)
    hit_tokens = int(sums["hit_tokens"] or 0)

    def share(x: int, of: int) -> float | None:
        return x / of if of else None

    by_retention: list[dict[str, Any]] = [
        {
            "max_age_s": t,
            "hit_tokens": int(sums[_bucket_col(t)] or 0),
            "hit_share": share(int(sums[_bucket_col(t)] or 0), prompt_tokens),
        }
        for t in age_buckets_s
    ] + [
        {"max_age_s": None, "hit_tokens": hit_tokens, "hit_share": share(hit_tokens, prompt_tokens)}
    ]
    bins = []
    lower: float = 0.0
    previous = 0
    for entry in by_retention:
        tokens = int(entry["hit_tokens"])
        upper = entry["max_age_s"]
        bins.append(
            {
                "from_s": lower,
                "to_s": upper,
                "hit_tokens": tokens - previous,
                "share_of_hits": share(tokens - previous, hit_tokens),
            }
        )
        previous = tokens
        lower = float(upper) if upper is not None else math.inf
    cross: dict[str, Any] | None = None
    if sums["tenants_logged"]:
        same = int(sums["hit_tokens_same_tenant"] or 0)
        cross = {
            "hit_tokens_same_tenant": same,
            "hit_tokens_cross_tenant": hit_tokens - same,
            "cross_tenant_share_of_hits": share(hit_tokens - same, hit_tokens),
            "isolated_hit_share": share(same, prompt_tokens),
        }
    return {
        "requests": int(sums["requests"]),
        "requests_with_hit": int(sums["requests_with_hit"]),
        "prompt_tokens": prompt_tokens,
        "hit_tokens": hit_tokens,
        "hit_share": share(hit_tokens, prompt_tokens),
        "prompt_blocks": int(sums["prompt_blocks"] or 0),
        "hit_blocks": int(sums["hit_blocks"] or 0),
        "block_hit_share": share(int(sums["hit_blocks"] or 0), int(sums["prompt_blocks"] or 0)),
        "by_retention": by_retention,
        "age_bins": bins,
        "cross_tenant": cross,
        "retention_needed_s": _retention_needed(per_request),
    }


def _retention_needed(per_request: pl.DataFrame) -> dict[str, float | None]:
    """Cache retention (seconds after last use) that serves 50 / 90 / 99 % of the unbounded hit
    tokens, conservatively: a request counts only when its deepest hit block is within it
    (shallower blocks are younger, so the true share at that retention is at least this)."""
    hits = (
        per_request.filter(pl.col("hashes_known") & (pl.col("hit_tokens") > 0))
        .select("last_seen_age_s", "hit_tokens")
        .sort("last_seen_age_s")
        .with_columns((pl.col("hit_tokens").cum_sum() / pl.col("hit_tokens").sum()).alias("cum"))
    )
    result: dict[str, float | None] = {}
    for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        reached = hits.filter(pl.col("cum") >= q - 1e-12)
        result[name] = float(reached["last_seen_age_s"][0]) if reached.height else None
    return result


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
