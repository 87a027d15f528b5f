"""Turning polars frames into Dagster metadata (markdown tables and previews)."""

from __future__ import annotations

import dagster as dg
import polars as pl


def frame_markdown(frame: pl.DataFrame, max_rows: int = 50) -> str:
    if frame.is_empty():
        return "_none_"
    with pl.Config(
        tbl_formatting="MARKDOWN",
        tbl_hide_dataframe_shape=True,
        tbl_hide_column_data_types=True,
        tbl_rows=max_rows,
        tbl_cols=-1,
        fmt_str_lengths=80,
    ):
        return str(frame.head(max_rows))


def frame_preview(frame: pl.DataFrame, rows: int = 5) -> dg.MetadataValue:
    head = frame.head(rows)
    records = [
        dg.TableRecord(
            {
                k: v if isinstance(v, int | float | str | bool) or v is None else str(v)
                for k, v in row.items()
            }
        )
        for row in head.to_dicts()
    ]
    schema = dg.TableSchema(
        columns=[dg.TableColumn(name=c, type=str(t)) for c, t in head.schema.items()]
    )
    return dg.MetadataValue.table(records=records, schema=schema)
