"""Traffic mix: logged sessions, tenants, models, required features, provider-reported caching.

Sessions are taken only from a logged ``session_id`` (inferred sessions are another stage's
job). Within a session, turns are ordered by (arrival, turn), remaining ties in table order:

* **turns per session**: rows per session_id;
* **inter-turn gap**: arrival of turn k+1 − arrival of turn k, in seconds. It contains the
  previous turn's own response time plus the user's (or agent's) think time;
* **history growth**: prompt_tokens of turn k+1 − prompt_tokens of turn k (negative when the
  client truncated or compacted its history).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from pipeline.shape.common import US_PER_S, arrival_us, collect, distribution

TOP_CATEGORIES = 20
# Every model is listed (WorkloadFacts.models reads the list); tenants keep the top 20.
MAX_MODELS_LISTED = 1000


def session_steps(logged: pl.LazyFrame) -> pl.LazyFrame:
    """One row per pair of consecutive turns of a session (the first turn of each: nulls):
    ``gap_s`` and ``growth`` (module docstring). One stable sort, so input order breaks the
    ties (session, arrival, turn) leave."""
    same = pl.col("session_id") == pl.col("session_id").shift()
    return (
        logged.select(
            "session_id", arrival_us().alias("t"), pl.col("turn"), pl.col("prompt_tokens")
        )
        .sort(["session_id", "t", "turn"], nulls_last=True, maintain_order=True)
        .select(
            pl.when(same).then(pl.col("t").diff() / US_PER_S).alias("gap_s"),
            pl.when(same).then(pl.col("prompt_tokens").diff()).alias("growth"),
        )
    )


def session_metrics(frame: pl.LazyFrame) -> dict[str, Any]:
    """Sessions, turns per session, inter-turn gaps and history growth (logged sessions only)."""
    logged = frame.filter(pl.col("session_id").is_not_null())
    head = collect(
        logged.select(pl.len().alias("rows"), pl.col("session_id").n_unique().alias("sessions"))
    ).row(0, named=True)
    if head["rows"] == 0:
        return {"known": False, "reason": "no session_id logged"}
    turns = collect(logged.group_by("session_id").agg(pl.len().alias("turns"))).lazy()
    # Materialised once: the distributions below read it several times.
    steps = collect(session_steps(logged)).lazy()
    growth = distribution(steps, "growth")
    negative = collect(steps.select((pl.col("growth") < 0).sum())).item()
    return {
        "known": True,
        "rows_with_session": int(head["rows"]),
        "sessions": int(head["sessions"]),
        "turns_per_session": distribution(turns, "turns"),
        "multi_turn_sessions": int(collect(turns.select((pl.col("turns") > 1).sum())).item()),
        "inter_turn_gap_s": distribution(steps, "gap_s"),
        "history_growth_tokens": {
            **growth,
            "negative_steps": int(negative or 0),
        },
    }


def category_metrics(frame: pl.LazyFrame, column: str, top: int = TOP_CATEGORIES) -> dict[str, Any]:
    """Distinct values of a categorical column and the top ``top`` by request share.

    Shares are over all requests; requests where the column is null are ``unlogged``.
    """
    counts = collect(
        frame.select(pl.col(column)).drop_nulls().group_by(column).agg(pl.len().alias("requests"))
    )
    return category_of(counts, column, collect(frame.select(pl.len())).item(), top)


def category_of(counts: pl.DataFrame, column: str, total: int, top: int) -> dict[str, Any]:
    """:func:`category_metrics` from the requests per logged value (columns ``column``,
    ``requests``) and the number of requests."""
    counts = counts.sort(["requests", column], descending=[True, False])
    logged = int(counts["requests"].sum()) if counts.height else 0
    return {
        "logged": counts.height > 0,
        "distinct": counts.height,
        "requests_logged": logged,
        "requests_unlogged": total - logged,
        "top": [
            {"value": value, "requests": n, "share": n / total}
            for value, n in counts.head(top).iter_rows()
        ],
    }


FEATURE_FLAGS = ("structured_output", "tools")


def feature_sums() -> list[pl.Expr]:
    """The counts :func:`features_of` reads: rows, each flag's logged and true rows, rows with
    a LoRA adapter."""
    return [
        pl.len().alias("n"),
        *[
            expr
            for flag in FEATURE_FLAGS
            for expr in (
                pl.col(flag).count().alias(f"{flag}_logged"),
                pl.col(flag).sum().alias(f"{flag}_true"),
            )
        ],
        pl.col("lora_adapter").count().alias("lora_rows"),
    ]


def feature_metrics(frame: pl.LazyFrame) -> dict[str, Any]:
    """Shares of structured output and tools (among rows that log the flag) and LoRA adapters.

    ``lora_adapter`` null means "no adapter or not logged"; its share is over all requests.
    """
    row = collect(
        frame.select(
            *feature_sums(),
            pl.col("lora_adapter").drop_nulls().n_unique().alias("lora_distinct"),
        )
    ).row(0, named=True)
    return features_of(row)


def features_of(row: dict[str, Any]) -> dict[str, Any]:
    """:func:`feature_metrics` from the ``feature_sums`` and ``lora_distinct``."""
    out: dict[str, Any] = {}
    for flag in FEATURE_FLAGS:
        logged, true = int(row[f"{flag}_logged"]), int(row[f"{flag}_true"] or 0)
        out[flag] = {
            "logged_rows": logged,
            "requests": true,
            "share_of_logged": true / logged if logged else None,
        }
    n = int(row["n"])
    out["lora_adapter"] = {
        "requests": int(row["lora_rows"]),
        "distinct_adapters": int(row["lora_distinct"]),
        "share": int(row["lora_rows"]) / n if n else None,
    }
    return out


def provider_cache_sums(frame: pl.LazyFrame) -> pl.LazyFrame:
    """The rows that log cached tokens, their cached and their prompt tokens (one row)."""
    return frame.filter(pl.col("cached_tokens").is_not_null()).select(
        pl.len().alias("rows"),
        pl.col("cached_tokens").sum().alias("cached"),
        pl.col("prompt_tokens").sum().alias("prompt"),
    )


def provider_cache_metrics(frame: pl.LazyFrame) -> dict[str, Any]:
    """Σ cached_tokens / Σ prompt_tokens over the rows where the provider logged cached tokens."""
    return provider_cache_of(collect(provider_cache_sums(frame)).row(0, named=True))


def provider_cache_of(row: dict[str, Any]) -> dict[str, Any]:
    """:func:`provider_cache_metrics` from the ``provider_cache_sums``."""
    rows = int(row["rows"])
    if rows == 0:
        return {"logged": False, "reason": "no cached_tokens logged"}
    prompt = int(row["prompt"] or 0)
    return {
        "logged": True,
        "rows_logged": rows,
        "cached_tokens": int(row["cached"] or 0),
        "prompt_tokens": prompt,
        "cached_share": int(row["cached"] or 0) / prompt if prompt else None,
    }
