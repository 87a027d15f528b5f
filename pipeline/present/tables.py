"""Tables as Markdown, with one cell format for every value.

Every table in enginefit goes through :func:`markdown_table`, whether the rows come from a polars
frame or a list of dicts, so a number looks the same in the terminal, in Dagster's metadata and
in the report. :func:`cell` is the format: unknown (``None``, NaN, an ``Unknown``) → ``unknown``
(:mod:`pipeline.present.text`), booleans → yes/no, integers with thousands separators, floats
to a few significant digits.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from pipeline.present.text import UNKNOWN
from pipeline.unknown import Unknown


def cell(value: Any, digits: int = 3) -> str:
    """One value as table text (``digits`` significant digits below 1,000)."""
    if value is None or isinstance(value, Unknown):
        return UNKNOWN
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return UNKNOWN
        if math.isinf(value):
            return "∞" if value > 0 else "-∞"
        if value != 0 and abs(value) < 1000:
            return f"{value:.{digits}g}"
        return f"{value:,.0f}"
    if isinstance(value, list | tuple):
        return ", ".join(cell(v, digits) for v in value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(
    rows: pl.DataFrame | Sequence[Mapping[str, Any]],
    columns: Sequence[str] | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    max_rows: int = 50,
    digits: int = 3,
) -> str:
    """A Markdown table of ``columns`` (default: all) of ``rows``; ``_none_`` when empty.

    ``headers`` renames columns for display; rows past ``max_rows`` are summarised in a last
    line (the full table lives in the stage's Parquet/JSON output).
    """
    records = rows.to_dicts() if isinstance(rows, pl.DataFrame) else list(rows)
    if columns is None:
        columns = (
            rows.columns if isinstance(rows, pl.DataFrame) else list(records[0]) if records else []
        )
    if not records or not columns:
        return "_none_"
    names = headers or {}
    lines = [
        "| " + " | ".join(names.get(c, c) for c in columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for record in records[:max_rows]:
        lines.append("| " + " | ".join(cell(record.get(c), digits) for c in columns) + " |")
    if len(records) > max_rows:
        lines.append(f"\n_{len(records) - max_rows:,} more rows not shown_")
    return "\n".join(lines)


def key_value_table(rows: Sequence[tuple[str, Any]], headers: tuple[str, str]) -> str:
    """A two-column table of (label, value) pairs."""
    return markdown_table(
        [{headers[0]: label, headers[1]: value} for label, value in rows], list(headers)
    )


def bullet_list(items: Sequence[str], empty: str = "none") -> str:
    """Markdown bullets, or ``empty`` when there are none."""
    return "\n".join(f"- {item}" for item in items) if items else empty


def text_table(
    rows: Sequence[Sequence[str]], headers: Sequence[str], *, indent: str = "  "
) -> list[str]:
    """Plain-text columns for a terminal (no Markdown pipes): each column as wide as its widest
    cell, left-aligned, two spaces apart; trailing blanks trimmed."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    return [
        (indent + "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True))).rstrip()
        for r in [headers, *rows]
    ]


def wrapped(text: str, width: int, indent: str = "", hanging: str = "  ") -> list[str]:
    """``text`` wrapped to ``width`` columns, continuation lines indented by ``hanging`` (long
    words such as paths are broken rather than overflow)."""
    return textwrap.wrap(
        text,
        width=width,
        initial_indent=indent,
        subsequent_indent=hanging,
        break_on_hyphens=False,
    ) or [indent.rstrip()]
