"""The reuse potential's totals (definitions: :mod:`pipeline.prefix.compute`), summed chunk by
chunk of requests in arrival order, from an exact replay or estimated from a sampled one.

- :class:`ReuseGroups`: what keeps caches apart ((model, adapter) namespace; tenant), from the
  table's distinct values, and each chunk's codes of them.
- :func:`reuse_frame`: per request of a chunk, from an exact replay's arrays.
- :class:`PromptTotals`: what the requests bring (exact in every mode).
- :class:`HitTotals`: what hit, summed over :func:`reuse_frame`'s frames, or filled in from a
  sampled replay's sums by :func:`estimate_hits` (with the standard errors).
- :class:`RetentionAges`: hit tokens by age, for the retention percentiles.
- :func:`reuse_summary` / :func:`summary_of`: the summary's ``reuse`` keys.

Estimates from a sampled replay (:mod:`pipeline.prefix.replay`): with hashes chained, a
request's held prompt blocks are its leading ones, so its hit blocks are the count of held
blocks among its prompt blocks, and its hit tokens the count below its hit limit times B. Each
is a ratio over the kept uses (held / kept, below the limit for tokens, within an age for a
retention) times the exact total it applies to (prompt blocks, blocks below the limit):
SHARDS's adjusted count (Waldspurger et al., FAST '15). Its standard error comes from 64 random
groups of the kept hashes, each hash's uses in one (Wolter, *Introduction to Variance Estimation*,
2nd ed., Springer 2007, ch. 2): Var(ρ) ≈ f · G/(G − 1) · Σ_p (y_p − ρ x_p)² / x², f = (1 −
rate) / (1 − rate / G) removing what splitting the blocks into groups adds when nothing is
sampled (0 at rate 1).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.prefix.cache_rules import NAMESPACE_COLUMNS, hit_limit_blocks
from pipeline.prefix.compute import PrefixInputError
from pipeline.prefix.replay import (
    HELD,
    HELD_FIRST,
    HELD_LIMIT,
    HELD_WITHIN,
    USES,
    USES_FIRST,
    USES_LIMIT,
    Replay,
)
from pipeline.shape.sketch import QuantileSketch

I64 = npt.NDArray[np.int64]

# Hit requests whose age and hit tokens the retention percentiles keep exactly (16 bytes each:
# 268 MB; a generated 10M-request trace has 9.8M); past it a weighted DDSketch, within
# RELATIVE_ERROR of each percentile.
RETENTION_EXACT_MAX = 1 << 24


def bucket_col(seconds: float) -> str:
    return f"hit_tokens_within_{seconds:g}s"


@dataclass(frozen=True)
class ReuseGroups:
    """The replays' groups: the shared replay's (model, LoRA adapter) namespace (when there are
    several) and the same-tenant replay's (namespace, tenant) (when a tenant is logged; a null
    tenant is the tenant ""), numbered from the table's distinct values so that every chunk's
    codes agree."""

    namespaces: pl.DataFrame | None  # the namespace columns as strings and "_namespace"
    tenants: pl.DataFrame | None  # "tenant" and "_tenant"

    @classmethod
    def of(cls, pairs: pl.DataFrame, tenants: pl.Series) -> ReuseGroups:
        """The groups of a table whose distinct (model, lora_adapter) are ``pairs`` and
        distinct tenants ``tenants`` (a null counts as a value of its own in both)."""
        names = [c for c in NAMESPACE_COLUMNS if pairs[c].null_count() < pairs.height]
        namespaces = None
        if names:
            distinct = (
                pairs.select(pl.col(names).cast(pl.String)).unique().sort(names, nulls_last=False)
            )
            if distinct.height > 1:
                namespaces = distinct.with_row_index("_namespace")
        found = None
        if tenants.null_count() < tenants.len():
            found = (
                pl.DataFrame({"tenant": tenants.cast(pl.String).fill_null("")})
                .unique()
                .sort("tenant")
                .with_row_index("_tenant")
            )
        return cls(namespaces, found)

    @classmethod
    def of_table(cls, requests: pl.DataFrame) -> ReuseGroups:
        """The groups of a table in memory."""
        return cls.of(
            requests.select(
                pl.col(c) if c in requests.columns else pl.lit(None, pl.String).alias(c)
                for c in NAMESPACE_COLUMNS
            ).unique(),
            requests["tenant"].unique()
            if "tenant" in requests.columns
            else pl.Series("tenant", [], pl.String),
        )

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns a chunk must carry for :meth:`codes`."""
        names = (
            [c for c in self.namespaces.columns if c != "_namespace"]
            if self.namespaces is not None
            else []
        )
        return (*names, *(("tenant",) if self.tenants is not None else ()))

    @property
    def namespace_count(self) -> int:
        return self.namespaces.height if self.namespaces is not None else 1

    @property
    def tenant_count(self) -> int:
        return self.tenants.height if self.tenants is not None else 0

    def digest(self) -> str:
        """SHA-256 of the numbering (what a replay's table keys mean: a pass kept between
        days is read back only under the same)."""
        digest = hashlib.sha256()
        for frame in (self.namespaces, self.tenants):
            digest.update(b"-" if frame is None else frame.write_csv().encode())
        return digest.hexdigest()

    def check(self, shift: int) -> None:
        """Refuse groups the packed tables cannot hold beside ``shift`` bits of arrival time
        (the shared replay's; the same-tenant replay stores none)."""
        several = self.namespaces.height if self.namespaces is not None else 1
        if several >= 1 << (63 - shift):
            raise PrefixInputError(
                f"{several} (model, adapter) namespaces: too many for the prefix replay's packed "
                f"table beside {shift} bits of arrival time"
            )
        if self.tenants is not None and several * self.tenants.height >= 1 << 62:
            raise PrefixInputError(
                f"{several * self.tenants.height} (namespace, tenant) groups: too many for the "
                "prefix replay's packed table"
            )

    def codes(self, chunk: pl.DataFrame) -> tuple[I64, I64 | None]:
        """The chunk's namespace codes (empty when there is one namespace) and (namespace,
        tenant) codes (None when no tenant is logged)."""
        namespace = np.zeros(0, np.int64)
        if self.namespaces is not None:
            names = [c for c in self.namespaces.columns if c != "_namespace"]
            namespace = (
                chunk.select(pl.col(c).cast(pl.String) for c in names)
                .join(
                    self.namespaces, on=names, how="left", nulls_equal=True, maintain_order="left"
                )["_namespace"]
                .cast(pl.Int64)
                .to_numpy()
            )
        if self.tenants is None:
            return namespace, None
        tenant = (
            chunk.select(pl.col("tenant").cast(pl.String).fill_null(""))
            .join(self.tenants, on="tenant", how="left", maintain_order="left")["_tenant"]
            .cast(pl.Int64)
            .to_numpy()
        )
        if namespace.size:
            tenant = namespace * self.tenants.height + tenant
        return namespace, tenant


def reuse_frame(
    known: npt.NDArray[np.bool_],
    prompt_tokens: I64,
    chain_blocks: npt.NDArray[np.int32],
    hit: npt.NDArray[np.int32],
    age: I64,
    within: npt.NDArray[np.int32],
    same_hit: npt.NDArray[np.int32] | None,
    block_size: int,
    age_buckets_s: tuple[float, ...],
    row0: int = 0,
) -> pl.DataFrame:
    """Per request of a chunk (in arrival order), from an exact replay's arrays (``hit``,
    ``age``, ``within``; ``same_hit`` the same-tenant replay's, None when no tenant is logged):
    what an unbounded prefix cache could serve, how long ago the hit prefix was last seen, and
    the same-tenant part.

    Columns: ``row`` (input row, from ``row0``), ``hashes_known``, ``prompt_tokens``,
    ``prompt_blocks``, ``hit_blocks``, ``hit_tokens``, ``hit_tokens_within_<T>s`` for each
    retention ``T``, ``last_seen_age_s`` (age of the deepest hit block; null without a hit),
    ``hit_tokens_same_tenant`` (null when no tenant is logged).
    """
    n = known.shape[0]
    limit = hit_limit_blocks(prompt_tokens, block_size)

    def tokens(blocks: npt.NDArray[Any]) -> I64:
        served: I64 = np.minimum(blocks.astype(np.int64), limit) * block_size
        return served

    columns: dict[str, Any] = {
        "row": np.arange(row0, row0 + n, dtype=np.int64),
        "hashes_known": known,
        "prompt_tokens": prompt_tokens,
        "prompt_blocks": chain_blocks.astype(np.int64),
        "hit_blocks": hit.astype(np.int64),
        "hit_tokens": tokens(hit),
    }
    for i, t in enumerate(age_buckets_s):
        columns[bucket_col(t)] = tokens(within[:, i])
    columns["last_seen_age_s"] = pl.Series(np.where(age >= 0, age / 1e6, np.nan)).fill_nan(None)
    columns["hit_tokens_same_tenant"] = (
        tokens(same_hit) if same_hit is not None else pl.Series([None] * n, dtype=pl.Int64)
    )
    return pl.DataFrame(columns)


@dataclass
class PromptTotals:
    """What the requests with known hashes bring, exact in every mode: requests, prompt tokens,
    full prompt blocks, blocks below the hit limit, requests with at least one block."""

    requests: int = 0
    prompt_tokens: int = 0
    prompt_blocks: int = 0
    limit_blocks: int = 0
    with_blocks: int = 0

    def add(
        self,
        known: npt.NDArray[np.bool_],
        prompt_tokens: I64,
        chain_blocks: npt.NDArray[np.int32],
        limit: I64,
    ) -> None:
        blocks = chain_blocks[known].astype(np.int64)
        self.requests += int(np.count_nonzero(known))
        self.prompt_tokens += int(prompt_tokens[known].sum())
        self.prompt_blocks += int(blocks.sum())
        self.limit_blocks += int(np.minimum(limit[known], blocks).sum())
        self.with_blocks += int(np.count_nonzero(blocks))


@dataclass
class RetentionAges:
    """Hit tokens by the age of what served them, for the retention a cache needs: every age
    kept while there are at most ``exact_max``, then a weighted DDSketch (relative error
    ``RELATIVE_ERROR``; ``pipeline.shape.sketch``)."""

    exact_max: int = field(default_factory=lambda: RETENTION_EXACT_MAX)
    _ages: list[npt.NDArray[np.float64]] = field(default_factory=list)
    _tokens: list[I64] = field(default_factory=list)
    _n: int = 0
    sketch: QuantileSketch | None = None

    def add(self, ages_s: npt.NDArray[np.float64], tokens: I64) -> None:
        if self.sketch is None and self._n + ages_s.shape[0] <= self.exact_max:
            self._ages.append(ages_s)
            self._tokens.append(tokens)
            self._n += ages_s.shape[0]
            return
        if self.sketch is None:
            self.sketch = QuantileSketch()
            for a, t in zip(self._ages, self._tokens, strict=True):
                self.sketch.add(a, t)
            self._ages, self._tokens = [], []
        self.sketch.add(ages_s, tokens)

    def needed(self) -> dict[str, float | None]:
        """Cache retention (seconds after last use) that serves 50 / 90 / 99 % of the hit
        tokens: the smallest age whose tokens, with every younger one's, reach that share."""
        shares = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
        if self.sketch is not None:
            return {name: self.sketch.first_reaching(q) for name, q in shares.items()}
        ages = np.concatenate(self._ages) if self._ages else np.zeros(0)
        tokens = np.concatenate(self._tokens) if self._tokens else np.zeros(0, np.int64)
        order = np.argsort(ages, kind="stable")
        reached = np.cumsum(tokens[order]) / tokens.sum() if tokens.size else tokens
        result: dict[str, float | None] = {}
        for name, q in shares.items():
            at = int(np.searchsorted(reached, q - 1e-12, side="left"))
            result[name] = float(ages[order[at]]) if at < ages.shape[0] else None
        return result


@dataclass
class HitTotals:
    """What an unbounded cache hit, summed over requests with known hashes (see
    :func:`reuse_frame`), and the hit tokens by age (``retention``)."""

    age_buckets_s: tuple[float, ...]
    retention: RetentionAges = field(default_factory=RetentionAges)
    hit_blocks: int = 0
    hit_tokens: int = 0
    requests_with_hit: int = 0
    within_tokens: list[int] = field(default_factory=list)
    same_tenant_tokens: int | None = None  # None: no tenant logged

    def __post_init__(self) -> None:
        self.within_tokens = self.within_tokens or [0] * len(self.age_buckets_s)

    def add(self, per_request: pl.DataFrame) -> None:
        """A chunk's :func:`reuse_frame`."""
        known = per_request.filter(pl.col("hashes_known"))
        sums = known.select(
            pl.col("hit_blocks").sum(),
            pl.col("hit_tokens").sum(),
            (pl.col("hit_blocks") > 0).sum().alias("requests_with_hit"),
            *[pl.col(bucket_col(t)).sum() for t in self.age_buckets_s],
            pl.col("hit_tokens_same_tenant").sum(),
            pl.col("hit_tokens_same_tenant").is_not_null().any().alias("tenants_logged"),
        ).row(0, named=True)
        self.hit_blocks += int(sums["hit_blocks"] or 0)
        self.hit_tokens += int(sums["hit_tokens"] or 0)
        self.requests_with_hit += int(sums["requests_with_hit"])
        for i, t in enumerate(self.age_buckets_s):
            self.within_tokens[i] += int(sums[bucket_col(t)] or 0)
        if sums["tenants_logged"]:
            self.add_same_tenant(int(sums["hit_tokens_same_tenant"] or 0))
        hits = known.filter(pl.col("hit_tokens") > 0)
        self.retention.add(
            hits["last_seen_age_s"].to_numpy().astype(np.float64),
            hits["hit_tokens"].to_numpy().astype(np.int64),
        )

    def add_same_tenant(self, tokens: int) -> None:
        self.same_tenant_tokens = (self.same_tenant_tokens or 0) + tokens


def _share(x: int, of: int) -> float | None:
    return x / of if of else None


def summary_of(prompt: PromptTotals, hits: HitTotals) -> dict[str, Any]:
    """The summary's ``reuse`` keys: hit tokens and shares, by retention and tenant."""
    prompt_tokens, hit_tokens = prompt.prompt_tokens, hits.hit_tokens
    by_retention: list[dict[str, Any]] = [
        {"max_age_s": t, "hit_tokens": n, "hit_share": _share(n, prompt_tokens)}
        for t, n in zip(hits.age_buckets_s, hits.within_tokens, strict=True)
    ] + [
        {
            "max_age_s": None,
            "hit_tokens": hit_tokens,
            "hit_share": _share(hit_tokens, prompt_tokens),
        }
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
                "share_of_hits": _share(tokens - previous, hit_tokens),
            }
        )
        previous = tokens
        lower = float(upper) if upper is not None else math.inf
    cross: dict[str, Any] | None = None
    if hits.same_tenant_tokens is not None:
        same = hits.same_tenant_tokens
        cross = {
            "hit_tokens_same_tenant": same,
            "hit_tokens_cross_tenant": hit_tokens - same,
            "cross_tenant_share_of_hits": _share(hit_tokens - same, hit_tokens),
            "isolated_hit_share": _share(same, prompt_tokens),
        }
    return {
        "requests": prompt.requests,
        "requests_with_hit": hits.requests_with_hit,
        "prompt_tokens": prompt_tokens,
        "hit_tokens": hit_tokens,
        "hit_share": _share(hit_tokens, prompt_tokens),
        "prompt_blocks": prompt.prompt_blocks,
        "hit_blocks": hits.hit_blocks,
        "block_hit_share": _share(hits.hit_blocks, prompt.prompt_blocks),
        "by_retention": by_retention,
        "age_bins": bins,
        "cross_tenant": cross,
        "retention_needed_s": hits.retention.needed(),
    }


def reuse_summary(per_request: pl.DataFrame, age_buckets_s: tuple[float, ...]) -> dict[str, Any]:
    """:func:`summary_of` one :func:`reuse_frame` (a whole table's)."""
    known = per_request.filter(pl.col("hashes_known"))
    prompt = PromptTotals(
        requests=known.height,
        prompt_tokens=int(known["prompt_tokens"].sum()),
        prompt_blocks=int(known["prompt_blocks"].sum()),
    )
    hits = HitTotals(age_buckets_s)
    hits.add(per_request)
    return summary_of(prompt, hits)


def _group_ratio(
    held: npt.NDArray[np.float64], uses: npt.NDArray[np.float64], rate: float
) -> tuple[float, float]:
    """The ratio Σ held / Σ uses over the groups and its standard error (module docstring)."""
    total = float(uses.sum())
    if total <= 0:
        return 0.0, 0.0
    ratio = float(held.sum()) / total
    groups = held.shape[0]
    z = held - ratio * uses
    correction = (1.0 - rate) / (1.0 - rate / groups)
    variance = correction * groups / (groups - 1) * float(np.sum(z * z)) / total**2
    return ratio, math.sqrt(max(variance, 0.0))


def estimate_hits(
    hits: HitTotals, prompt: PromptTotals, replay: Replay, block_size: int
) -> dict[str, Any]:
    """Fill ``hits`` (all but the same-tenant part and the ages) from a sampled shared
    replay's sums; returns the standard errors of the shares (``ReuseEstimate``'s keys)."""
    sums, rate = replay.sums, replay.rate
    per_block, block_error = _group_ratio(sums[:, HELD], sums[:, USES], rate)
    first, first_error = _group_ratio(sums[:, HELD_FIRST], sums[:, USES_FIRST], rate)
    below, below_error = _group_ratio(sums[:, HELD_LIMIT], sums[:, USES_LIMIT], rate)
    hits.hit_blocks = round(per_block * prompt.prompt_blocks)
    hits.requests_with_hit = round(first * prompt.with_blocks)
    hits.hit_tokens = round(below * prompt.limit_blocks) * block_size
    to_share = (
        prompt.limit_blocks * block_size / prompt.prompt_tokens if prompt.prompt_tokens else 0.0
    )
    within_errors: list[float | None] = []
    for i in range(len(hits.age_buckets_s)):
        share, error = _group_ratio(sums[:, HELD_WITHIN + i], sums[:, USES_LIMIT], rate)
        hits.within_tokens[i] = round(share * prompt.limit_blocks) * block_size
        within_errors.append(error * to_share)
    return {
        "hit_share_standard_error": below_error * to_share,
        "block_hit_share_standard_error": block_error,
        "requests_with_hit_standard_error": first_error * prompt.with_blocks,
        "by_retention_standard_errors": [*within_errors, below_error * to_share],
    }


def estimate_same_tenant(
    hits: HitTotals, prompt: PromptTotals, replay: Replay, block_size: int
) -> float:
    """Fill the same-tenant hit tokens of ``hits`` from a sampled same-tenant replay (at most
    the hit tokens: a same-tenant hit is a hit); returns the isolated share's standard error."""
    share, error = _group_ratio(replay.sums[:, HELD_LIMIT], replay.sums[:, USES_LIMIT], replay.rate)
    hits.same_tenant_tokens = min(round(share * prompt.limit_blocks) * block_size, hits.hit_tokens)
    to_share = (
        prompt.limit_blocks * block_size / prompt.prompt_tokens if prompt.prompt_tokens else 0.0
    )
    return error * to_share
