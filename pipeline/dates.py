"""The date a decision and its report are as of (the report date), and the checks that keep
every age measured from it a real age.

One notion of "as of": ``bench.as_of`` (or ``--as-of``, or ``ENGINEFIT_RUN_DATE``) when given,
else the clock on the day the decision is made — in ``enginefit report`` the day its version
is first published. The decision record carries it, the version's manifest records it as
``report_date``, and a re-render of that version reads it back from there, so the document
stays byte-identical. Benchmark, catalog and maintenance ages are measured from it; a date
after it (a benchmark run, a catalog edition) is an error naming the file and key, never a
negative age.
"""

from __future__ import annotations

import datetime as dt

import polars as pl

from pipeline.errors import ConfigError, InputFormatError


def today() -> dt.date:
    """The clock's date (UTC): the report date when none is given, and the limit no date may
    pass. The one place enginefit reads the clock for a date (callers write ``dates.today()``,
    so a test can set the clock here)."""
    return dt.datetime.now(dt.UTC).date()


def not_in_future(value: dt.date) -> dt.date:
    """``value`` when it is today or earlier; a ValueError saying why not (a report dated in
    the future would measure every age from a day that has not come)."""
    now = today()
    if value > now:
        raise ValueError(
            f"{value.isoformat()} is after today ({now.isoformat()}): a decision cannot be dated "
            "in the future; give today's date or an earlier one"
        )
    return value


def days_from(day: dt.date, reference: dt.date) -> str:
    """Where ``day`` lies from ``reference`` in words: ``"391 days before"``, ``"the same day
    as"``, ``"1 day after"`` (an age is never a negative number)."""
    days = (reference - day).days
    if days == 0:
        return "the same day as"
    count = f"{abs(days):,} day{'s' if abs(days) != 1 else ''}"
    return f"{count} before" if days > 0 else f"{count} after"


def refuse_runs_after(points: pl.DataFrame, limit: dt.date, limit_name: str) -> None:
    """A benchmark run dated after ``limit`` cannot be measured from it: the first such load
    point is an error naming its result file, its manifest and the ``run_date`` key."""
    if "run_date" not in points.columns or points.is_empty():
        return
    late = points.filter(pl.col("run_date") > limit)
    if late.is_empty():
        return
    columns = [c for c in ("source_file", "manifest_file") if c in late.columns]
    row = late.sort(["run_date", *columns]).row(0, named=True)
    source = row.get("source_file") or "a benchmark result"
    manifest = row.get("manifest_file")
    raise InputFormatError(
        f"{source}{f' (manifest {manifest})' if manifest else ''}: run_date "
        f"{row['run_date'].isoformat()} is after {limit_name} ({limit.isoformat()}): a benchmark "
        "cannot have run after the date the decision is made; correct run_date in the manifest "
        "(or the date in the result file), or date the decision later (bench.as_of, --as-of)"
    )


def refuse_future(value: dt.date, where: str) -> None:
    """``where`` (a file and key, e.g. a catalog's ``as_of``) dated after today: an error (a
    date from the future would pass as fresh)."""
    now = today()
    if value > now:
        raise ConfigError(
            f"{where}: {value.isoformat()} is after today ({now.isoformat()}): a date from the "
            "future would pass as fresh; correct it"
        )
