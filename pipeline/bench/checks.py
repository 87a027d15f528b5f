"""Pure predicates over the bench stage's written tables; each returns the list of problems
(empty: the check passes). The assets wrap them as Dagster asset checks."""

from __future__ import annotations

import polars as pl

from pipeline.bench.config import BenchConfig
from pipeline.bench.frames import column_or_null, float_column
from pipeline.bench.keepup import KEPT_UP
from pipeline.bench.schema import impossible_values
from pipeline.bench.slo import required_requests
from pipeline.bench.validity import FINDINGS_SCHEMA


def no_silent_pass(evaluated: pl.DataFrame, settings: BenchConfig) -> list[str]:
    """Problems (empty = none): a ``pass`` without every limited value present and within its
    limit, enough completed requests for each limited percentile, (open loop) a server that kept
    up, and no impossible value in the record. The predicate behind an asset check."""
    slo, min_tail_requests = settings.slo, settings.min_tail_requests
    cols = [c for c in slo.columns() if c in evaluated.columns]
    missing_cols = [c for c in slo.columns() if c not in evaluated.columns]
    passes = evaluated.filter(pl.col("slo_status") == "pass")
    if passes.height and missing_cols:
        return [f"{passes.height} passes although columns {missing_cols} are absent"]
    bad_exprs = [pl.col(c).is_null() | pl.col(c).is_nan() for c in cols]
    completed = float_column(evaluated, "completed")
    for limit in slo.limits:
        if limit.column(slo.itl_definition) in evaluated.columns:
            bad_exprs.append(pl.col(limit.column(slo.itl_definition)) > limit.max_ms)
        needed = required_requests(limit.stat, min_tail_requests)
        bad_exprs.append(completed.is_null() | (completed < needed))
    if slo.max_error_rate is not None:
        bad_exprs.append(
            pl.col("error_rate").is_null() | (pl.col("error_rate") > slo.max_error_rate)
        )
    sweep = column_or_null(evaluated, "sweep", pl.String())
    keep_up = column_or_null(evaluated, "keep_up_status", pl.String())
    bad_exprs.append(sweep.eq_missing("open") & ~keep_up.eq_missing(KEPT_UP))
    bad_exprs.append(impossible_values(evaluated).list.len() > 0)
    bad = passes.filter(pl.any_horizontal(bad_exprs).fill_null(True)).height
    if not bad:
        return []
    return [
        f"{bad} of {passes.height} passing points have a missing or broken limit, too few "
        "requests for a percentile, an open-loop server not shown to keep up, or an impossible "
        "value"
    ]


def findings_well_formed(findings: pl.DataFrame) -> list[str]:
    """Problems (empty = none): a finding outside the findings schema, with an unknown status
    or without a message. The predicate behind an asset check."""
    if dict(findings.schema) != FINDINGS_SCHEMA:
        return [f"schema {dict(findings.schema)} is not FINDINGS_SCHEMA"]
    bad = findings.filter(
        ~pl.col("status").is_in(["flag", "ok", "unknown"])
        | pl.col("message").is_null()
        | (pl.col("message") == "")
    ).height
    return [f"{bad} of {findings.height} findings are malformed"] if bad else []
