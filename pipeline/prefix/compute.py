"""Prefix-sharing curve, reuse potential and curve-shape classification.

The curve is polars expressions; the reuse potential is one arrival-order replay of an unbounded
cache (a numba kernel in :mod:`pipeline.prefix.replay`, assembled here with polars).

Definitions (also in ``docs/prefix.md``)
---------------------------------------
Only requests with ``hashes_known`` take part; count-only requests are reported separately
(``requests_hashes_unknown``) and share nothing. ``B`` is the block size of the hash chain.

*Window grid.* ``W = B·2^j`` for ``j = 0, 1, …`` while ``W`` ≤ the longest prompt (powers of
two when ``B`` is one); at least ``W = B``. Windows below ``B`` or between grid points cannot be
answered from full-block hashes: the chain sees sharing only in whole blocks, so a window that
is not a multiple of ``B`` would be rounded down to one, and ``W < B`` not at all.

*Shared-prefix ratio at W* (DOMAIN.md): the share of requests whose first ``W`` prompt tokens
are also the first ``W`` prompt tokens of at least one other request (earlier or later). With
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
prompt of exactly k·B tokens hits (k − 1)·B (``pipeline.cache_rules.hit_limit_blocks``, vLLM's
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
from typing import Any

import numpy as np
import polars as pl

from pipeline.cache_rules import hit_limit_blocks, namespace_codes, namespaced_ids
from pipeline.errors import EnginefitError
from pipeline.hashmap import dense_ids
from pipeline.prefix.config import PrefixConfig
from pipeline.prefix.replay import replay_unbounded
from pipeline.sessions import flat_lists


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


def table_block_size(requests: pl.DataFrame) -> int | None:
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


def coarsen(requests: pl.DataFrame, factor: int) -> pl.DataFrame:
    """The same table at block size ``factor × block_size`` (every ``factor``-th chain hash)."""
    if factor == 1:
        return requests
    return requests.with_columns(
        pl.col("prefix_hashes").list.gather_every(factor, offset=factor - 1),
        (pl.col("prompt_blocks") // factor).cast(pl.Int32),
        (pl.col("block_size") * factor).cast(pl.Int32),
    )


def at_block_size(requests: pl.DataFrame, block_size: int | None) -> tuple[pl.DataFrame, int]:
    """The table coarsened to ``block_size`` (or as is), and the block size used."""
    native = table_block_size(requests)
    if native is None:
        return requests, block_size or 1
    if block_size is None or block_size == native:
        return requests, native
    if block_size % native:
        raise PrefixInputError(
            f"block size {block_size} is not a multiple of the table's block size {native}; "
            "coarser analysis strides the hash chain, so it needs a multiple"
        )
    return coarsen(requests, block_size // native), block_size


def window_grid(block_size: int, max_prompt_tokens: int) -> list[int]:
    """``B·2^j`` for j = 0, 1, … up to ``max_prompt_tokens`` (always at least ``[B]``)."""
    grid = [block_size]
    while grid[-1] * 2 <= max_prompt_tokens:
        grid.append(grid[-1] * 2)
    return grid


def _known(requests: pl.DataFrame | pl.LazyFrame) -> pl.LazyFrame:
    return (
        requests.lazy()
        .filter(pl.col("hashes_known").fill_null(False))
        .select(
            pl.col("prompt_tokens").fill_null(0).cast(pl.Int64),
            pl.min_horizontal(
                pl.col("prompt_blocks").fill_null(0).cast(pl.Int64),
                pl.col("prefix_hashes").list.len().fill_null(0).cast(pl.Int64),
            ).alias("pb"),
            pl.col("prefix_hashes"),
        )
    )


def sharing_curve(requests: pl.DataFrame | pl.LazyFrame, block_size: int) -> pl.DataFrame:
    """The shared-prefix ratio at every window of :func:`window_grid` (one row per window)."""
    known = _known(requests)
    max_prompt = known.select(pl.col("prompt_tokens").max()).collect().item()
    grid = window_grid(block_size, int(max_prompt or 0))
    per_window = [
        known.select(
            pl.col("prompt_tokens"),
            (pl.col("pb") >= k).alias("eligible"),
            pl.when(pl.col("pb") >= k)
            .then(pl.col("prefix_hashes").list.get(k - 1, null_on_oob=True))
            .alias("h"),
        )
        .with_columns((pl.col("h").is_not_null() & pl.col("h").is_duplicated()).alias("sharing"))
        .select(
            pl.lit(w, dtype=pl.Int64).alias("window_tokens"),
            pl.lit(k, dtype=pl.Int64).alias("window_blocks"),
            pl.len().cast(pl.Int64).alias("requests"),
            pl.col("eligible").sum().cast(pl.Int64).alias("eligible"),
            pl.col("sharing").sum().cast(pl.Int64).alias("sharing"),
            pl.col("prompt_tokens").sum().cast(pl.Int64).alias("prompt_tokens"),
            pl.col("prompt_tokens")
            .filter("eligible")
            .sum()
            .cast(pl.Int64)
            .alias("prompt_tokens_eligible"),
            pl.col("prompt_tokens")
            .filter("sharing")
            .sum()
            .cast(pl.Int64)
            .alias("prompt_tokens_sharing"),
        )
        for w, k in ((w, w // block_size) for w in grid)
    ]
    frames = pl.collect_all(per_window)
    return (
        pl.concat(frames)
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


def reuse_per_request(
    requests: pl.DataFrame,
    block_size: int,
    age_buckets_s: tuple[float, ...] = (60.0, 600.0, 3600.0),
) -> pl.DataFrame:
    """Per request (in input order, which must be arrival order): what an unbounded prefix cache
    could serve, how long ago the hit prefix was last seen, and the same-tenant part.

    Columns: ``row`` (input row), ``hashes_known``, ``prompt_tokens``, ``prompt_blocks``, ``hit_blocks``,
    ``hit_tokens``, ``hit_tokens_within_<T>s`` for each retention ``T``, ``last_seen_age_s``
    (age of the deepest hit block; null without a hit), ``hit_tokens_same_tenant`` (null when
    no tenant is logged).
    """
    n = requests.height
    known = requests["hashes_known"].fill_null(False).to_numpy().astype(np.bool_)
    flat = flat_lists(requests["prefix_hashes"])
    lens = np.diff(flat.offsets)
    prompt_tokens = requests["prompt_tokens"].fill_null(0).cast(pl.Int64).to_numpy()
    pb = np.minimum(requests["prompt_blocks"].fill_null(0).cast(pl.Int64).to_numpy(), lens)
    pb[~known] = 0
    arrival_us = requests["arrival"].dt.epoch("us").to_numpy()
    tenants_logged = requests["tenant"].null_count() < n

    buckets_us = np.array([t * 1e6 for t in age_buckets_s], dtype=np.float64)
    arange = np.arange(n, dtype=np.int64)
    keys = _namespaced_keys(requests, flat.offsets, flat.values)
    hit, age_us, within = replay_unbounded(
        flat.offsets, keys, pb, known, arrival_us, arange, np.zeros(n, np.int64), buckets_us
    )
    columns: dict[str, object] = {
        "row": arange,
        "hashes_known": known,
        "prompt_tokens": prompt_tokens,
        "prompt_blocks": pb,
        "hit_blocks": hit,
        "last_seen_age_s": np.where(age_us >= 0, age_us / 1e6, np.nan),
    }
    for i in range(len(age_buckets_s)):
        columns[f"_blocks_{i}"] = within[:, i]
    if tenants_logged:
        tenant_code = (
            requests["tenant"].fill_null("").cast(pl.Categorical).to_physical().cast(pl.Int64)
        ).to_numpy()
        order = np.argsort(tenant_code, kind="stable").astype(np.int64)
        same, _, _ = replay_unbounded(
            flat.offsets,
            keys,
            pb,
            known,
            arrival_us,
            order,
            tenant_code[order],
            np.zeros(0, dtype=np.float64),
        )
        columns["_blocks_same"] = same
    else:
        columns["_blocks_same"] = pl.Series([None] * n, dtype=pl.Int64)
    columns["_limit"] = hit_limit_blocks(prompt_tokens, block_size)
    base = pl.DataFrame(columns).with_columns(pl.col("last_seen_age_s").fill_nan(None))

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
        pl.when(pl.lit(tenants_logged))
        .then(tokens("_blocks_same"))
        .otherwise(None)
        .cast(pl.Int64)
        .alias("hit_tokens_same_tenant"),
    )


def _namespaced_keys(
    requests: pl.DataFrame, offsets: np.ndarray[Any, Any], values: np.ndarray[Any, Any]
) -> np.ndarray[Any, Any]:
    """The chain hashes, re-keyed per (model, LoRA adapter) when the table has several."""
    namespace = namespace_codes(requests)
    if namespace.size == 0 or int(namespace.max()) == 0:
        return values
    ids, n_ids = dense_ids(values)
    keyed, _ = namespaced_ids(ids, offsets, namespace, n_ids)
    return np.asarray(keyed, dtype=np.uint64)


def reuse_summary(per_request: pl.DataFrame, age_buckets_s: tuple[float, ...]) -> dict[str, Any]:
    """Totals of :func:`reuse_per_request` over the requests with known hashes: hit tokens and
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


def classify_curve(
    curve: pl.DataFrame, median_prompt_tokens: float | None, config: PrefixConfig
) -> dict[str, Any]:
    """Shape of the sharing curve, with the numbers behind it.

    ``short`` = the smallest grid window ≥ ``classify_short_window_tokens`` (or the largest
    window when every prompt is shorter); ``long`` = the largest grid window ≤
    min(``classify_long_window_tokens``, median prompt tokens), if it is above ``short``. Both use
    ``share_eligible`` (requests that reach the window), so short prompts do not read as short
    sharing. ``no sharing`` when share(short) < ``no_sharing_below``; else ``long shared
    context`` when share(long) / share(short) ≥ ``long_context_retention``; else ``short system
    prompt``. Without a long window (median prompt ≤ short window) the shape is ``short system
    prompt`` when sharing exists (prompts are too short to carry long shared context).
    """
    thresholds = {
        "short_window_tokens": config.classify_short_window_tokens,
        "long_window_tokens": config.classify_long_window_tokens,
        "no_sharing_below": config.no_sharing_below,
        "long_context_retention": config.long_context_retention,
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
    short = next((w for w in grid if w >= config.classify_short_window_tokens), grid[-1])
    cap = min(config.classify_long_window_tokens, median_prompt_tokens or 0)
    long_candidates = [w for w in grid if short < w <= cap]
    long = long_candidates[-1] if long_candidates else None

    def share_at(w: int) -> float:
        value = windows.filter(pl.col("window_tokens") == w)["share_eligible"].item()
        return float(value or 0.0)

    s_short = share_at(short)
    s_long = share_at(long) if long is not None else None
    retention = s_long / s_short if s_long is not None and s_short > 0 else None
    if s_short < config.no_sharing_below:
        shape = "no sharing"
        reason = f"share at {short} tokens {s_short:.1%} < {config.no_sharing_below:.0%}"
    elif retention is not None and retention >= config.long_context_retention:
        shape = "long shared context"
        reason = (
            f"share at {long} tokens is {retention:.0%} of the share at {short} tokens "
            f"(≥ {config.long_context_retention:.0%})"
        )
    elif retention is None:
        shape = "short system prompt"
        reason = f"median prompt too short for a long window above {short} tokens"
    else:
        shape = "short system prompt"
        reason = (
            f"share at {long} tokens is only {retention:.0%} of the share at {short} tokens "
            f"(< {config.long_context_retention:.0%})"
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
