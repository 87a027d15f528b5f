"""Column access that tolerates frames built by hand or by older readers (missing columns)."""

from __future__ import annotations

import polars as pl


def column_or_null(frame: pl.DataFrame, name: str, dtype: pl.DataType) -> pl.Expr:
    """A column as an expression, or typed nulls when the frame does not have it."""
    if name in frame.columns:
        return pl.col(name).cast(dtype)
    return pl.lit(None, dtype=dtype)


def float_column(frame: pl.DataFrame, name: str) -> pl.Expr:
    """A float column with NaN as null (a NaN percentile is a missing one), or typed nulls."""
    return column_or_null(frame, name, pl.Float64()).fill_nan(None)
