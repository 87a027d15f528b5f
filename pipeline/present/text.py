"""Numbers, shares, months, money and the unknown as a reader sees them: every formatter
enginefit shows text with, written once for the terminal, Dagster's metadata and the report.

An unknown value is ``None`` or a typed :class:`~pipeline.unknown.Unknown`, and it is the word
``unknown`` everywhere, never 0 and never blank. Where there is room for the reason (prose: the
rationale, headlines, notes) :func:`unknown_text` of an ``Unknown`` reads "unknown — <reason>";
a table cell is short, so every formatter here renders it as the bare word and the reason is
told beside the table. ``—`` (:data:`NOTHING`) is not unknown: it marks a cell with nothing to
show (no previous value, no switch to pay back, no quarantine reasons).
"""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from pipeline.unknown import Unknown

UNKNOWN = "unknown"
NOTHING = "—"


def unknown_text(value: Unknown | None) -> str:
    """An unknown value in prose: the word, and the reason when there is one."""
    return f"{UNKNOWN} — {value.reason}" if isinstance(value, Unknown) else UNKNOWN


def number(value: float | Unknown | None, digits: int = 0, unit: str = "") -> str:
    """Thousands separators, ``digits`` decimals for a float, then the unit."""
    if value is None or isinstance(value, Unknown):
        return UNKNOWN
    text = f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"
    return f"{text} {unit}".strip()


_LARGE = ((1e12, "trillion"), (1e9, "billion"), (1e6, "million"))


def quantity(value: float | int) -> str:
    """A count as a reader says it, one rounding rule everywhere: three significant digits in
    words from a million (``3.06 billion``), whole with thousands separators below
    (``85,401``)."""
    for size, word in _LARGE:
        if abs(value) >= size:
            return f"{value / size:.3g} {word}"
    return f"{value:,.0f}"


def share(value: float | Unknown | None, digits: int = 1) -> str:
    """A fraction as a percentage (0.123 → ``12.3%``)."""
    return UNKNOWN if value is None or isinstance(value, Unknown) else f"{value:.{digits}%}"


def sample_rate(rate: float) -> str:
    """A sampling rate as a percentage with two decimals, and two significant figures below 1 %
    so that a tiny rate never reads as 0 (0.3912 → ``39.12%``, 0.000034 → ``0.0034%``)."""
    return f"{rate:.2%}" if rate >= 0.01 or rate == 0 else f"{significant(rate * 100, 2)}%"


def months(value: float | Unknown | None) -> str:
    """A payback time: ``never`` when it never pays back."""
    if value is None or isinstance(value, Unknown):
        return UNKNOWN
    return "never" if math.isinf(value) else f"{value:,.1f} months"


def significant(value: float | Unknown | None, digits: int = 3) -> str:
    """A number to ``digits`` significant figures in plain notation, with thousands separators
    (15,234,567,890 → ``15,200,000,000``; 0.84671 → ``0.847``; 3.0 → ``3``): a threshold a
    reader can say."""
    if value is None or isinstance(value, Unknown):
        return UNKNOWN
    if value == 0:
        return "0"
    places = digits - 1 - math.floor(math.log10(abs(value)))
    text = f"{round(value, places):,.{max(places, 0)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def money(value: float | Unknown | None, digits: int = 0) -> str:
    """Dollars, whole by default (``$2,390``)."""
    return UNKNOWN if value is None or isinstance(value, Unknown) else f"${value:,.{digits}f}"


def usd(value: float | Unknown | None) -> str:
    """A per-token price, to the hundredth of a cent (``$0.1450``)."""
    return money(value, 4)


def money_band(band: tuple[float, float] | None, digits: int = 0) -> str:
    """A band of dollars (``$1,200–$2,400``); a band whose ends round alike is one figure."""
    if band is None:
        return UNKNOWN
    low, high = money(band[0], digits), money(band[1], digits)
    return low if low == high else f"{low}–{high}"


def months_band(band: tuple[float | str, float | str] | None) -> str:
    """A payback band (soonest, latest), either end ``never``: said in words, never as a
    negative or infinite number of months."""
    if band is None:
        return UNKNOWN
    soonest, latest = band
    if soonest == "never":
        return "never at either end of the band"
    if latest == "never":
        return f"{months(float(soonest))} at best, never at worst"
    low, high = months(float(soonest)), months(float(latest))
    return low if low == high else f"{float(soonest):,.1f}–{high}"


def measurement(value: Any) -> str:
    """A measurement or threshold of any type (a trigger's, a rule's evidence)."""
    if value is None or isinstance(value, Unknown):
        return UNKNOWN
    if isinstance(value, float):
        # Plain notation: 85,401, 3.06 billion and 0.0001234, never 8.54e+04.
        if abs(value) >= 1e3:
            return quantity(value)
        text = f"{value:.4g}"
        return (
            f"{value:.{4 + max(0, -math.floor(math.log10(abs(value))))}f}".rstrip("0")
            if "e" in text
            else text
        )
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 1e3:
        return quantity(value)
    if isinstance(value, dict):
        # Each number in plain notation too (JSON would write 1e-05).
        return "{" + ", ".join(f"{k}: {measurement(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(measurement(v) for v in value) + "]"
    return str(value)


def decimal_expr(expr: pl.Expr, digits: int = 2) -> pl.Expr:
    """A polars number as text in a message: rounded, without a trailing ``.0`` (``92.19``, ``1``)."""
    return expr.round(digits).cast(pl.String).str.replace(r"\.0$", "")
