"""A mergeable quantile sketch with a relative-error guarantee (DDSketch's log-spaced buckets).

A value x ≠ 0 falls in bucket ``i = ceil(log_γ |x|)`` of its sign, γ = (1 + α) / (1 − α); zero
has a bucket of its own. Each bucket counts its values exactly, so merging two sketches adds
their counts bucket by bucket and gives exactly the sketch of the union (the bucket of a value
depends on nothing else). A quantile is the rank the exact method would pick
(``common.PERCENTILE_METHOD``: index floor((n − 1)·q + 0.5) of the sorted values, found exactly
from the counts); its bucket (γ^(i−1), γ^i] is reported as 2γ^i / (γ + 1), within a relative
error α of every value in it, then clamped to the exact minimum and maximum (which keeps it
within α). Source: Masson, Rim, Lee, "DDSketch: A Fast and Fully-Mergeable Quantile Sketch with
Relative-Error Guarantees", PVLDB 12(12), 2019, https://www.vldb.org/pvldb/vol12/p2195-masson.pdf.

Memory: one (index, count) pair per occupied bucket, about ln(max/min) / (2α) of them per sign
(some 7,000 for six decades at α = 0.1 %), whatever the number of values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import polars as pl

# The relative error of every sketched percentile the shape stage reports.
RELATIVE_ERROR = 0.001

_EMPTY = np.zeros(0, dtype=np.int64)


def _merge_counts(
    a_idx: npt.NDArray[np.int64],
    a_n: npt.NDArray[np.int64],
    b_idx: npt.NDArray[np.int64],
    b_n: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Sorted distinct bucket indices and summed counts of two (index, count) sets."""
    idx, inverse = np.unique(np.concatenate([a_idx, b_idx]), return_inverse=True)
    counts = np.bincount(inverse, weights=np.concatenate([a_n, b_n]), minlength=idx.size)
    return idx.astype(np.int64), np.rint(counts).astype(np.int64)


@dataclass
class QuantileSketch:
    """Log-bucketed counts of the values seen (see the module docstring); ``add`` and ``merge``
    update it in place."""

    alpha: float = RELATIVE_ERROR
    count: int = 0
    zeros: int = 0
    min: float = math.inf
    max: float = -math.inf
    pos_idx: npt.NDArray[np.int64] = field(default_factory=lambda: _EMPTY)
    pos_n: npt.NDArray[np.int64] = field(default_factory=lambda: _EMPTY)
    neg_idx: npt.NDArray[np.int64] = field(default_factory=lambda: _EMPTY)
    neg_n: npt.NDArray[np.int64] = field(default_factory=lambda: _EMPTY)

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise ValueError(f"QuantileSketch: alpha must be in (0, 1), got {self.alpha}")

    @property
    def gamma(self) -> float:
        return (1 + self.alpha) / (1 - self.alpha)

    def _index(self, magnitudes: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
        return np.ceil(np.log(magnitudes) / math.log(self.gamma)).astype(np.int64)

    def add(self, values: npt.ArrayLike, weights: npt.ArrayLike | None = None) -> QuantileSketch:
        """Count ``values`` (nulls must be dropped first; NaN and infinity are refused), each
        once or ``weights`` times (non-negative integers, one per value)."""
        x = np.asarray(values, dtype=np.float64).ravel()
        if x.size == 0:
            return self
        if not np.isfinite(x).all():
            raise ValueError("QuantileSketch.add: values must be finite (drop nulls and NaN)")
        w = np.ones(x.size, np.int64) if weights is None else np.asarray(weights, np.int64)
        self.count += int(w.sum())
        self.min = min(self.min, float(x.min()))
        self.max = max(self.max, float(x.max()))
        self.zeros += int(w[x == 0].sum())
        for sign in (1, -1):
            chosen = x > 0 if sign > 0 else x < 0
            part = np.abs(x[chosen])
            if part.size == 0:
                continue
            idx, inverse = np.unique(self._index(part), return_inverse=True)
            n = np.bincount(inverse, weights=w[chosen], minlength=idx.size)
            n = np.rint(n).astype(np.int64)
            if sign > 0:
                self.pos_idx, self.pos_n = _merge_counts(self.pos_idx, self.pos_n, idx, n)
            else:
                self.neg_idx, self.neg_n = _merge_counts(self.neg_idx, self.neg_n, idx, n)
        return self

    def merge(self, other: QuantileSketch) -> QuantileSketch:
        """Add ``other``'s counts to this sketch's (both must share ``alpha``)."""
        if other.alpha != self.alpha:
            raise ValueError(f"QuantileSketch.merge: alpha {other.alpha} differs from {self.alpha}")
        self.count += other.count
        self.zeros += other.zeros
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        self.pos_idx, self.pos_n = _merge_counts(
            self.pos_idx, self.pos_n, other.pos_idx, other.pos_n
        )
        self.neg_idx, self.neg_n = _merge_counts(
            self.neg_idx, self.neg_n, other.neg_idx, other.neg_n
        )
        return self

    def buckets(self) -> int:
        """Occupied buckets (the sketch's size)."""
        return int(self.pos_idx.size + self.neg_idx.size + (self.zeros > 0))

    def first_reaching(self, share: float) -> float | None:
        """The smallest value whose count with every smaller one's reaches ``share`` of the
        total (the weighted quantile; within relative error ``alpha``); None when empty."""
        if self.count == 0:
            return None
        gamma = self.gamma
        values = np.concatenate(
            [
                -2 * gamma ** self.neg_idx[::-1].astype(np.float64) / (gamma + 1),
                np.zeros(1 if self.zeros else 0),
                2 * gamma ** self.pos_idx.astype(np.float64) / (gamma + 1),
            ]
        )
        counts = np.concatenate(
            [self.neg_n[::-1], np.array([self.zeros] if self.zeros else [], np.int64), self.pos_n]
        )
        reached = np.cumsum(counts) / self.count
        at = min(int(np.searchsorted(reached, share - 1e-12, side="left")), values.size - 1)
        return min(max(float(values[at]), self.min), self.max)

    def quantile(self, q: float) -> float | None:
        """The value at rank floor((n − 1)·q + 0.5), within relative error ``alpha``; None when
        the sketch is empty."""
        if self.count == 0:
            return None
        rank = math.floor((self.count - 1) * q + 0.5)
        gamma = self.gamma
        # Ascending order: negatives from the largest magnitude down, zeros, positives up.
        negatives = int(self.neg_n.sum())
        if rank < negatives:
            cum = np.cumsum(self.neg_n[::-1])
            i = int(self.neg_idx[::-1][int(np.searchsorted(cum, rank, side="right"))])
            value = -2 * gamma**i / (gamma + 1)
        elif rank < negatives + self.zeros:
            value = 0.0
        else:
            cum = np.cumsum(self.pos_n)
            at = int(np.searchsorted(cum, rank - negatives - self.zeros, side="right"))
            i = int(self.pos_idx[at])
            value = 2 * gamma**i / (gamma + 1)
        return min(max(value, self.min), self.max)


def merged(sketches: Iterable[QuantileSketch], alpha: float = RELATIVE_ERROR) -> QuantileSketch:
    """One sketch holding every sketch's counts."""
    out = QuantileSketch(alpha)
    for sketch in sketches:
        out.merge(sketch)
    return out


def sketch_table(sketch: QuantileSketch) -> pl.DataFrame:
    """A sketch as rows (``sign``: 1, -1 or 0 for zeros; ``idx``; ``n``) and one header row
    (``sign`` 2: count in ``n``; min and max in ``lo``/``hi``)."""
    rows = pl.DataFrame(
        {
            "sign": [1] * sketch.pos_idx.size + [-1] * sketch.neg_idx.size + [0],
            "idx": [*sketch.pos_idx.tolist(), *sketch.neg_idx.tolist(), 0],
            "n": [*sketch.pos_n.tolist(), *sketch.neg_n.tolist(), sketch.zeros],
        },
        schema={"sign": pl.Int8, "idx": pl.Int64, "n": pl.Int64},
    )
    head = pl.DataFrame(
        {"sign": [2], "idx": [0], "n": [sketch.count]},
        schema={"sign": pl.Int8, "idx": pl.Int64, "n": pl.Int64},
    )
    return pl.concat([head, rows]).with_columns(
        pl.lit(sketch.min).alias("lo"), pl.lit(sketch.max).alias("hi")
    )


def sketch_of(table: pl.DataFrame) -> QuantileSketch:
    """The sketch :func:`sketch_table` wrote."""
    by = {sign: table.filter(pl.col("sign") == sign) for sign in (2, 1, -1, 0)}
    out = QuantileSketch()
    out.count = int(by[2]["n"][0])
    out.min, out.max = float(table["lo"][0]), float(table["hi"][0])
    out.zeros = int(by[0]["n"][0])
    out.pos_idx, out.pos_n = by[1]["idx"].to_numpy().copy(), by[1]["n"].to_numpy().copy()
    out.neg_idx, out.neg_n = by[-1]["idx"].to_numpy().copy(), by[-1]["n"].to_numpy().copy()
    return out
