"""Rows split into groups by a hash of one column, spilled to a temporary folder, so a
per-key aggregation over a table larger than memory holds one group at a time: every row of a
key lands in the same group, and each group is about ``rows / groups`` rows.

The chunks are read once, in order, and each group keeps the chunks' order (a stable sort of a
group breaks ties in table order, as one of the whole table would). The folder is removed when
the ``with`` block ends, whatever happens in it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import polars as pl

# Fixed so the split, and so every figure computed group by group, is the same on every run.
HASH_SEED = 20_191_219


@contextmanager
def hash_groups(
    chunks: Iterable[pl.LazyFrame], key: str, groups: int, prefix: str = "enginefit-spill-"
) -> Iterator[list[pl.LazyFrame]]:
    """The rows of ``chunks`` in ``groups`` groups by a hash of ``key`` (a group no row went to
    is an empty frame of the chunks' schema; of a ``key`` column alone without any chunk)."""
    if groups < 1:
        raise ValueError(f"hash_groups: groups must be >= 1, got {groups}")
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        folder = Path(tmp)
        schema: pl.Schema | None = None
        for c, chunk in enumerate(chunks):
            schema = schema or chunk.collect_schema()
            rows = chunk.with_columns(
                (pl.col(key).hash(HASH_SEED) % groups).alias("__group")
            ).collect(engine="streaming")
            for (group,), part in rows.partition_by("__group", as_dict=True).items():
                part.drop("__group").write_parquet(folder / f"g{group:06d}-c{c:06d}.parquet")
        frames = []
        for group in range(groups):
            files = sorted(folder.glob(f"g{group:06d}-c*.parquet"))
            frames.append(
                pl.scan_parquet(files) if files else pl.LazyFrame(schema=schema or {key: pl.Null})
            )
        yield frames
