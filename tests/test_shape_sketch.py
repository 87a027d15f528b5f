"""The mergeable quantile sketch: hand-checked buckets, its relative-error bound against the exact
percentile on heavy-tailed data, and merging that equals sketching the union."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from pipeline.shape.sketch import RELATIVE_ERROR, QuantileSketch, merged, sketch_of, sketch_table


def _rep(alpha: float, value: float) -> float:
    """The bucket representative of ``value`` > 0, by hand: 2γ^i / (γ + 1), i = ⌈log_γ value⌉."""
    gamma = (1 + alpha) / (1 - alpha)
    i = math.ceil(math.log(value) / math.log(gamma))
    return 2 * gamma**i / (gamma + 1)


def test_hand_checked_small_cases() -> None:
    # alpha 0.1: gamma = 11/9; 5 lies in bucket 9 = (gamma^8, gamma^9] = (4.98, 6.09].
    sketch = QuantileSketch(0.1).add([0, 5, 100])
    gamma = 1.1 / 0.9
    assert gamma**8 < 5 <= gamma**9
    assert sketch.quantile(0.5) == pytest.approx(2 * gamma**9 / (gamma + 1))  # 5.478
    assert abs(sketch.quantile(0.5) - 5) / 5 <= 0.1  # type: ignore[operator]
    assert sketch.quantile(0.0) == 0.0  # the zero bucket is exact
    assert sketch.quantile(1.0) == pytest.approx(_rep(0.1, 100))  # gamma^23 = 101.0 -> 90.9
    # 1 lies in bucket 0 = (gamma^-1, 1], whose representative 0.9 is below the exact minimum.
    assert QuantileSketch(0.1).add([1, 2]).quantile(0.0) == 1.0
    # Negatives sort before zero, the largest magnitude first; rank floor((n-1)q + 0.5).
    signed = QuantileSketch(0.1).add([-3, 0, 0, 7])
    # 3 lies in bucket 6 = (2.73, 3.33]: representative 3.00015, clamped to the exact minimum.
    assert -_rep(0.1, 3) < -3 == signed.quantile(0.0)
    assert signed.quantile(0.5) == 0.0  # rank floor(1.5 + 0.5) = 2: a zero
    assert signed.quantile(0.9) == pytest.approx(_rep(0.1, 7))  # rank 3: 6.695
    assert abs(signed.quantile(0.9) - 7) / 7 <= 0.1  # type: ignore[operator]
    three = QuantileSketch(0.1).add([-3, -20, 1])
    assert three.quantile(0.5) == pytest.approx(-_rep(0.1, 3))  # rank 1: -3, not clamped
    assert (three.count, three.zeros, three.min, three.max) == (3, 0, -20.0, 1.0)
    assert QuantileSketch().quantile(0.5) is None


def _heavy_tailed(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.concatenate(
        [
            rng.pareto(1.1, n // 2) * 50,  # power-law tail
            rng.lognormal(3, 2.5, n - n // 2 - 2000),  # 11 decades of spread
            np.zeros(1000),
            -rng.lognormal(4, 2, 1000),  # negative deltas (history growth)
        ]
    )
    return rng.permutation(x)


def test_relative_error_bound_against_the_exact_percentile() -> None:
    n = 200_001  # (n - 1)·q is whole for these q: numpy's "nearest" picks the same rank
    x = _heavy_tailed(n, seed=5)
    sketch = QuantileSketch().add(x)
    ordered = np.sort(x)
    qs = [0.0, 0.001, 0.01, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 0.99999, 1.0]
    by_polars = pl.Series(x).quantile
    for q in qs:
        exact = float(np.percentile(x, 100 * q, method="nearest"))
        assert exact == ordered[math.floor((n - 1) * q + 0.5)] == by_polars(q, "nearest")
        got = sketch.quantile(q)
        assert got is not None
        assert abs(got - exact) <= RELATIVE_ERROR * abs(exact) * (1 + 1e-12), q
    # The bound is tight enough to matter: a coarser sketch misses by more than 0.1 %.
    coarse = QuantileSketch(0.05).add(x)
    misses = []
    for q in (0.5, 0.9, 0.99):
        exact = float(ordered[round((n - 1) * q)])
        misses.append(abs(coarse.quantile(q) - exact) / exact)  # type: ignore[operator]
    assert RELATIVE_ERROR < max(misses) <= 0.05


def test_every_rank_within_the_bound_on_a_small_sample() -> None:
    x = _heavy_tailed(5_001, seed=11)
    sketch = QuantileSketch().add(x)
    ordered = np.sort(x)
    for rank in range(0, x.size, 7):
        q = rank / (x.size - 1)
        exact = ordered[math.floor((x.size - 1) * q + 0.5)]
        assert abs(sketch.quantile(q) - exact) <= RELATIVE_ERROR * abs(exact) * (1 + 1e-12)  # type: ignore[operator]


def test_merge_of_sketches_is_exactly_the_sketch_of_the_union() -> None:
    x = _heavy_tailed(50_000, seed=3)
    whole = QuantileSketch().add(x)
    pieces = [QuantileSketch().add(p) for p in np.array_split(x, [3, 17, 9000, 9001, 31_000])]
    forward, backward = merged(pieces), merged(reversed(pieces))
    for sketch in (forward, backward):
        for name in ("pos_idx", "pos_n", "neg_idx", "neg_n"):
            assert np.array_equal(getattr(sketch, name), getattr(whole, name)), name
        assert (sketch.count, sketch.zeros, sketch.min, sketch.max) == (
            whole.count,
            whole.zeros,
            whole.min,
            whole.max,
        )
        assert [sketch.quantile(q) for q in (0.1, 0.5, 0.99)] == [
            whole.quantile(q) for q in (0.1, 0.5, 0.99)
        ]
    # Size follows the spread of the values, not their number.
    assert whole.buckets() < 20_000 < x.size


def test_refuses_what_it_cannot_count() -> None:
    with pytest.raises(ValueError, match="finite"):
        QuantileSketch().add([1.0, math.nan])
    with pytest.raises(ValueError, match="alpha"):
        QuantileSketch(0.01).merge(QuantileSketch(0.02))
    with pytest.raises(ValueError, match="alpha"):
        QuantileSketch(1.0)


def test_a_sketch_kept_as_a_table_is_the_same_sketch() -> None:
    """What a day part keeps of its sketch reads back to equal counts and quantiles."""
    values = np.concatenate([np.linspace(-50, -0.5, 40), np.zeros(7), np.geomspace(0.01, 9e5, 300)])
    sketch = QuantileSketch().add(values)
    again = sketch_of(sketch_table(sketch))
    assert (again.count, again.zeros, again.min, again.max) == (
        sketch.count,
        sketch.zeros,
        sketch.min,
        sketch.max,
    )
    for a, b in ((again.pos_idx, sketch.pos_idx), (again.pos_n, sketch.pos_n)):
        assert np.array_equal(a, b)
    assert np.array_equal(again.neg_idx, sketch.neg_idx) and np.array_equal(
        again.neg_n, sketch.neg_n
    )
    assert [again.quantile(q) for q in (0.01, 0.2, 0.5, 0.99)] == [
        sketch.quantile(q) for q in (0.01, 0.2, 0.5, 0.99)
    ]
    empty = sketch_of(sketch_table(QuantileSketch()))
    assert empty.count == 0 and empty.quantile(0.5) is None and empty.buckets() == 0
