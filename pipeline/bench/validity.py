"""Is this benchmark about our traffic? The validity checks.

Each candidate (one engine deployment's sweep, :data:`pipeline.bench.slo.CANDIDATE_KEYS`) is
checked against the measured workload (:class:`pipeline.shape.facts.WorkloadFacts`) and against the
other candidates. Every check gives one finding row with ``status`` ``flag`` (a problem),
``ok`` or ``unknown`` (the numbers to decide are missing -- said, never assumed), a ``message``
naming the numbers behind it, and those numbers in ``bench_value`` / ``prod_value`` /
``threshold``.

Checks (``check`` column):

``fixed_length_prompts``  benchmark prompts of one length (p99/p50 ≤ ``FIXED_SPREAD`` or the tool
                          says so)
                          while production's prompt p99/p50 ≥ ``TAIL_RATIO``;
``prompt_length``         benchmark median prompt differs from production's by more than
                          ``LENGTH_FACTOR`` × either way; ``output_length`` the same for output;
``prefix_structure``      unique-prompt benchmark vs production sharing above
                          ``PREFIX_HEAVY_SHARE`` of requests, or a shared-prefix benchmark vs
                          production sharing below ``PREFIX_LIGHT_SHARE``
                          (docs/decision-rules.md#prefix-sharing);
``peak_rate``             the highest load the open-loop sweep *sustained* (a point that passed
                          the SLO, which includes keeping up; its send rate, never above its
                          offered rate) is below production's peak rate;
``stale``                 the run is older than ``max_age_days`` at ``as_of``;
``tail_sample``           the SLO's highest percentile at the capacity point rests on fewer than
                          ``TAIL_REQUESTS_ABOVE`` ÷ (1 − q) requests (about 1,000 for a p99): the
                          finding carries its order-statistic confidence interval (a p99 of 100
                          requests is their maximum, unbounded above);
``closed_loop``           closed-loop (concurrency) results, whose "capacity" is an achieved
                          rate, not an offered one, and which hide queueing (a user waits for
                          its answer before sending again; at concurrency 1 the latency is the
                          unloaded one); reported apart from the open-loop ranking;
``comparability``         (across candidates) different models, GPU types, quantisation or
                          client settings: the candidates are not ranked.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from pipeline.bench.cost import workload_rates
from pipeline.bench.frames import column_or_null
from pipeline.bench.keepup import send_rate_expr
from pipeline.bench.manifest import TRACE_DATASET
from pipeline.bench.slo import PERCENTILE_SHARES, candidate_keys, order_statistic_interval
from pipeline.errors import InputFormatError, os_reason
from pipeline.present.text import decimal_expr
from pipeline.safe_read import read_json
from pipeline.shape.facts import LatencyModel, Percentiles, WorkloadFacts
from pipeline.thresholds import (
    FIXED_SPREAD,
    LENGTH_FACTOR,
    PREFIX_HEAVY_SHARE,
    PREFIX_LIGHT_SHARE,
    TAIL_RATIO,
    TAIL_REQUESTS_ABOVE,
)

if TYPE_CHECKING:
    from pipeline.bench.config import BenchConfig

ALL_CANDIDATES = "(all candidates)"
UNIQUE_DATASETS = ("random", "random-ids", "sharegpt", "synthetic", "sonnet")
# Settings that must match for two candidates' costs to be ranked against each other.
COMPARABILITY_FIELDS = (
    "model",
    "gpu_type",
    "quantization",
    "client_protocol",
    "dataset",
    "input_len_target",
    "output_len_target",
    "arrival_process",
    "workload",
)

FINDINGS_SCHEMA: dict[str, pl.DataType] = {
    "candidate": pl.String(),
    "check": pl.String(),
    "status": pl.String(),
    "message": pl.String(),
    "bench_value": pl.Float64(),
    "prod_value": pl.Float64(),
    "threshold": pl.Float64(),
}


# --------------------------------------------------------------------------------------------
# WorkloadFacts from JSON


def _float_or_nan(value: Any) -> float:
    """JSON null (the shape stage writes NaN as null) back to NaN."""
    return math.nan if value is None else float(value)


def _percentiles(raw: Any, where: str) -> Percentiles:
    if not isinstance(raw, Mapping):
        raise InputFormatError(f"{where}: expected a mapping of p50/p90/p95/p99/max")
    try:
        return Percentiles(
            **{k: _float_or_nan(raw[k]) for k in ("p50", "p90", "p95", "p99", "max")}
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InputFormatError(f"{where}: needs numeric p50, p90, p95, p99, max ({exc})") from exc


def workload_facts_from_dict(
    raw: Mapping[str, Any], *, where: str = "workload_facts"
) -> WorkloadFacts:
    """Rebuild :class:`WorkloadFacts` from ``WorkloadFacts.as_dict()`` (e.g. read from JSON,
    where the shared-prefix windows became strings)."""
    if not isinstance(raw, Mapping):
        raise InputFormatError(f"{where}: expected a JSON object")
    try:
        latency = raw.get("latency_model")
        spr = raw.get("shared_prefix_ratio") or {}
        models = raw.get("models") or ()
        tenants = raw.get("tenants")
        return WorkloadFacts(
            requests=int(raw["requests"]),
            span_s=_float_or_nan(raw["span_s"]),
            mean_rate_rps=_float_or_nan(raw["mean_rate_rps"]),
            peak_rate_rps={
                str(k): float(v)
                for k, v in (raw.get("peak_rate_rps") or {}).items()
                if v is not None
            },
            prompt_tokens=_percentiles(raw["prompt_tokens"], f"{where}.prompt_tokens"),
            output_tokens=_percentiles(raw["output_tokens"], f"{where}.output_tokens"),
            peak_concurrency=_float_or_nan(raw["peak_concurrency"]),
            peak_concurrency_estimated=bool(raw["peak_concurrency_estimated"]),
            latency_model=LatencyModel(**latency) if isinstance(latency, Mapping) else None,
            shared_prefix_ratio={int(k): float(v) for k, v in spr.items() if v is not None},
            tenants=int(tenants) if tenants is not None else None,
            models=tuple(str(m) for m in models),
        )
    except KeyError as exc:
        raise InputFormatError(f"{where}: missing field {exc.args[0]!r}") from exc
    except (TypeError, ValueError) as exc:
        raise InputFormatError(f"{where}: malformed value ({exc})") from exc


#: What ``--workload-facts FILE`` accepts, said when a file is neither.
FACTS_EXPECTED = (
    "expected shape/workload_facts.json (written by `enginefit shape TRACE... --out DIR`) or "
    "what `enginefit shape TRACE... --json` prints"
)
_FACTS_KEYS = ("requests", "span_s", "mean_rate_rps", "prompt_tokens", "output_tokens")
_JSON_KINDS: dict[type, str] = {
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def load_workload_facts(path: Path) -> WorkloadFacts:
    """Workload facts from ``shape/workload_facts.json`` (the ``workload_shape`` asset,
    ``enginefit shape --out DIR``) or from what ``enginefit shape --json`` prints
    (``{"shape": …, "facts": …}``); anything else is an error naming the file and both."""
    try:
        raw = read_json(path)
    except OSError as exc:
        raise InputFormatError(f"{path}: cannot read workload facts ({os_reason(exc)})") from exc
    except InputFormatError as exc:
        raise InputFormatError(f"{exc}; {FACTS_EXPECTED}") from exc
    where = str(path)
    if isinstance(raw, Mapping) and "shape" in raw and "facts" in raw:
        raw, where = raw["facts"], f"{path}: facts"  # `enginefit shape --json`
    if not isinstance(raw, Mapping) or not all(key in raw for key in _FACTS_KEYS):
        if isinstance(raw, Mapping):
            keys = sorted(str(k) for k in raw)
            found = f"keys {', '.join(keys[:8])}{' …' if len(keys) > 8 else ''}" if keys else "{}"
        else:
            found = f"a JSON {_JSON_KINDS.get(type(raw), type(raw).__name__)}"
        raise InputFormatError(f"{where}: not workload facts (found {found}); {FACTS_EXPECTED}")
    return workload_facts_from_dict(raw, where=where)


# --------------------------------------------------------------------------------------------
# Candidate labels and per-candidate aggregates


def candidate_label_expr(frame: pl.DataFrame) -> pl.Expr:
    """``engine version backend / label / model / quant / N×GPU / workload`` (null parts
    skipped)."""

    def part(name: str) -> pl.Expr:
        return column_or_null(frame, name, pl.String())

    gpu = (
        pl.format("{}×{}", part("gpu_count"), part("gpu_type"))
        if "gpu_count" in frame.columns and "gpu_type" in frame.columns
        else pl.lit(None, dtype=pl.String)
    )
    engine = pl.concat_str(
        [part("engine"), part("engine_version"), part("backend")], separator=" ", ignore_nulls=True
    )
    return pl.concat_str(
        [engine, part("label"), part("model"), part("quantization"), gpu, part("workload")],
        separator=" / ",
        ignore_nulls=True,
    )


def candidate_profile(evaluated: pl.DataFrame) -> pl.DataFrame:
    """One row per candidate: what the validity checks compare (from :func:`evaluate_slo` rows)."""
    keys = candidate_keys(evaluated)
    f64 = pl.Float64()
    frame = evaluated.with_columns(
        candidate=candidate_label_expr(evaluated),
        _in_p50=pl.coalesce(
            column_or_null(evaluated, "input_tokens_p50", f64),
            column_or_null(evaluated, "input_tokens_mean", f64),
        ),
        _in_p99=column_or_null(evaluated, "input_tokens_p99", f64),
        _out_p50=pl.coalesce(
            column_or_null(evaluated, "output_tokens_p50", f64),
            column_or_null(evaluated, "output_tokens_mean", f64),
        ),
        _in_fixed=column_or_null(evaluated, "input_len_fixed", pl.Boolean()),
        _dataset=column_or_null(evaluated, "dataset", pl.String()),
        _workload=column_or_null(evaluated, "workload", pl.String()),
        _run_date=column_or_null(evaluated, "run_date", pl.Date()),
        _sustained=pl.min_horizontal(pl.col("load"), send_rate_expr(evaluated)),
        _completed=column_or_null(evaluated, "completed", f64),
    )
    passing = (pl.col("sweep") == "open") & (pl.col("slo_status") == "pass")
    sweep = pl.col("sweep")
    load = pl.col("load")
    agg = frame.group_by(keys, maintain_order=True).agg(
        candidate=pl.col("candidate").first(),
        n_points=pl.len(),
        n_open=(sweep == "open").sum(),
        n_closed=(sweep == "closed").sum(),
        n_other=(sweep == "other").sum(),
        closed_loads=decimal_expr(load.filter(sweep == "closed").unique().sort()).str.join(", "),
        min_closed_load=load.filter(sweep == "closed").min(),
        max_open_rate=load.filter(sweep == "open").max(),
        max_sustained_rate=pl.col("_sustained").filter(passing).max(),
        # Completed requests at the capacity point (the passing point sustaining most).
        capacity_requests=pl.col("_completed")
        .filter(passing)
        .sort_by(pl.col("_sustained").filter(passing))
        .last(),
        input_p50=pl.col("_in_p50").median(),
        input_p99=pl.col("_in_p99").max(),
        input_fixed_flag=pl.col("_in_fixed").drop_nulls().any(),
        input_fixed_known=pl.col("_in_fixed").is_not_null().any(),
        output_p50=pl.col("_out_p50").median(),
        datasets=pl.col("_dataset").drop_nulls().unique().sort().str.join(", "),
        workloads=pl.col("_workload").drop_nulls().unique().sort().str.join(", "),
        oldest_run=pl.col("_run_date").min(),
    )
    spread = pl.col("input_p99") / pl.col("input_p50")
    return agg.with_columns(
        input_spread=spread,
        input_fixed=pl.when(pl.col("input_fixed_flag") | (spread <= FIXED_SPREAD).fill_null(False))
        .then(True)
        .when(pl.col("input_fixed_known") | spread.is_not_null())
        .then(False)
        .otherwise(None),
        datasets=pl.when(pl.col("datasets") == "").then(None).otherwise(pl.col("datasets")),
        workloads=pl.when(pl.col("workloads") == "").then(None).otherwise(pl.col("workloads")),
    ).sort("candidate")


# --------------------------------------------------------------------------------------------
# Checks: each returns FINDINGS_SCHEMA rows, one per candidate


def _finding(
    profile: pl.DataFrame,
    check: str,
    status: pl.Expr,
    message: pl.Expr,
    bench_value: pl.Expr,
    prod_value: float | None,
    threshold: float | None,
) -> pl.DataFrame:
    return profile.select(
        candidate=pl.col("candidate"),
        check=pl.lit(check),
        status=status,
        message=message,
        bench_value=bench_value.cast(pl.Float64),
        prod_value=pl.lit(prod_value, dtype=pl.Float64),
        threshold=pl.lit(threshold, dtype=pl.Float64),
    )


def _unknown(
    profile: pl.DataFrame, check: str, message: str | pl.Expr, threshold: float | None = None
) -> pl.DataFrame:
    """Every candidate's ``check`` unknown, with why (text, or per candidate)."""
    why = pl.lit(message) if isinstance(message, str) else message
    nothing = pl.lit(None, dtype=pl.Float64)
    return _finding(profile, check, pl.lit("unknown"), why, nothing, None, threshold)


def _no_facts(profile: pl.DataFrame, check: str, what: str) -> pl.DataFrame:
    return _unknown(
        profile,
        check,
        f"{what} unknown: no workload facts (give --workload-facts FILE|DIR, or run "
        "`enginefit shape` for the configured workload)",
    )


def check_fixed_length(
    profile: pl.DataFrame, facts: WorkloadFacts | None, tail_ratio: float
) -> pl.DataFrame:
    if facts is None:
        return _no_facts(profile, "fixed_length_prompts", "production prompt-length tail")
    prod = facts.prompt_tokens
    if math.isnan(prod.p50) or math.isnan(prod.p99):
        return _unknown(profile, "fixed_length_prompts", "production prompt lengths not measured")
    prod_tail = prod.tail_ratio
    fixed = pl.col("input_fixed")
    prod_text = f"production prompt p99/p50 = {prod_tail:.2f} (p50 {prod.p50:g}, p99 {prod.p99:g})"
    status = (
        pl.when(fixed.is_null())
        .then(pl.lit("unknown"))
        .when(fixed & pl.lit(prod_tail >= tail_ratio))
        .then(pl.lit("flag"))
        .otherwise(pl.lit("ok"))
    )
    message = (
        pl.when(fixed.is_null())
        .then(pl.lit(f"benchmark prompt-length spread not recorded; {prod_text}"))
        .when(fixed)
        .then(
            pl.format(
                "benchmark prompts are (nearly) one fixed length (p50 {}, p99 {} tokens, "
                f"p99/p50 ≤ {FIXED_SPREAD:g} or configured fixed) while "
                + prod_text
                + (
                    f" ≥ {tail_ratio:g}: long-prompt (chunked-prefill) behaviour is not exercised"
                    if prod_tail >= tail_ratio
                    else f" < {tail_ratio:g}: acceptable"
                ),
                decimal_expr(pl.col("input_p50"), 1),
                pl.coalesce(decimal_expr(pl.col("input_p99"), 1), pl.lit("n/a")),
            )
        )
        .otherwise(
            pl.format(
                "benchmark prompt p99/p50 = {} (varied lengths); " + prod_text,
                decimal_expr(pl.col("input_spread"), 2),
            )
        )
    )
    return _finding(
        profile,
        "fixed_length_prompts",
        status,
        message,
        pl.col("input_spread"),
        prod_tail if math.isfinite(prod_tail) else None,
        tail_ratio,
    )


def check_length(
    profile: pl.DataFrame,
    facts: WorkloadFacts | None,
    factor: float,
    *,
    which: str,
) -> pl.DataFrame:
    check = f"{which}_length"
    if facts is None:
        return _no_facts(profile, check, f"production {which} length")
    prod = facts.prompt_tokens if which == "prompt" else facts.output_tokens
    if math.isnan(prod.p50):
        return _unknown(profile, check, f"production {which} lengths not measured")
    bench = pl.col("input_p50" if which == "prompt" else "output_p50")
    ratio = bench / prod.p50 if prod.p50 > 0 else pl.lit(None, dtype=pl.Float64)
    differs = (ratio > factor) | (ratio < 1.0 / factor)
    status = (
        pl.when(bench.is_null() | ratio.is_null())
        .then(pl.lit("unknown"))
        .when(differs)
        .then(pl.lit("flag"))
        .otherwise(pl.lit("ok"))
    )
    unknown_text = (
        pl.when(bench.is_null())
        .then(pl.lit(f"benchmark {which} length not recorded; production p50 {prod.p50:g} tokens"))
        .otherwise(pl.lit(f"production median {which} length is 0 tokens; cannot compare"))
    )
    message = (
        pl.when(bench.is_null() | ratio.is_null())
        .then(unknown_text)
        .otherwise(
            pl.format(
                "benchmark median {} {} tokens vs production p50 {} (p99 {}): ratio {} {} "
                "the ×{} tolerance",
                pl.lit(which),
                decimal_expr(bench, 1),
                pl.lit(f"{prod.p50:g}"),
                pl.lit(f"{prod.p99:g}"),
                decimal_expr(ratio, 2),
                pl.when(differs).then(pl.lit("outside")).otherwise(pl.lit("within")),
                pl.lit(f"{factor:g}"),
            )
        )
    )
    return _finding(profile, check, status, message, bench, prod.p50, factor)


def production_sharing(facts: WorkloadFacts | None) -> tuple[int, float] | None:
    """(window, ratio) used for the prefix check: the smallest window ≥ 64 tokens measured
    (the smallest one when all are shorter); None when the trace had no content."""
    if facts is None or not facts.shared_prefix_ratio:
        return None
    windows = sorted(facts.shared_prefix_ratio)
    chosen = next((w for w in windows if w >= 64), windows[0])
    return chosen, facts.shared_prefix_ratio[chosen]


def check_prefix(profile: pl.DataFrame, facts: WorkloadFacts | None) -> pl.DataFrame:
    check = "prefix_structure"
    if facts is None:
        return _no_facts(profile, check, "production prefix sharing")
    sharing = production_sharing(facts)
    datasets = pl.col("datasets").str.to_lowercase()
    bench_kind = (
        pl.when(datasets == TRACE_DATASET)
        .then(pl.lit("trace"))
        .when(datasets.str.contains("prefix"))
        .then(pl.lit("shared"))
        .when(datasets.is_in(list(UNIQUE_DATASETS)))
        .then(pl.lit("unique"))
        .otherwise(None)
    )
    bench_text = pl.format("benchmark dataset {}", pl.coalesce(pl.col("datasets"), pl.lit("?")))
    if sharing is None:
        return _unknown(
            profile,
            check,
            pl.format(
                "{}; production shared-prefix ratio unknown (the trace has no prompt content "
                "or `enginefit prefix` has not run), so prefix structure cannot be compared",
                bench_text,
            ),
        )
    window, ratio = sharing
    curve = ", ".join(
        f"W={w}: {facts.shared_prefix_ratio[w]:.0%}" for w in sorted(facts.shared_prefix_ratio)
    )
    prod_text = f"production shared-prefix ratio {ratio:.0%} at W={window} tokens ({curve})"
    status = (
        pl.when(bench_kind.is_null())
        .then(pl.lit("unknown"))
        .when(bench_kind == "trace")
        .then(pl.lit("ok"))
        .when((bench_kind == "unique") & pl.lit(ratio > PREFIX_HEAVY_SHARE))
        .then(pl.lit("flag"))
        .when((bench_kind == "shared") & pl.lit(ratio < PREFIX_LIGHT_SHARE))
        .then(pl.lit("flag"))
        .otherwise(pl.lit("ok"))
    )
    message = (
        pl.when(bench_kind.is_null())
        .then(pl.format("{}: prefix structure not known; " + prod_text, bench_text))
        .when(bench_kind == "trace")
        .then(
            pl.format(
                "{}: prompts replayed from workload {} with its lengths and shared prefixes "
                "(enginefit loadtest); " + prod_text,
                bench_text,
                pl.coalesce(pl.col("workloads"), pl.lit("?")),
            )
        )
        .when(status == "flag")
        .then(
            pl.format(
                "{} ({} prompts) vs " + prod_text + ": {}",
                bench_text,
                bench_kind,
                pl.when(bench_kind == "unique")
                .then(pl.lit("unique prompts overstate cost for a prefix-sharing workload"))
                .otherwise(pl.lit("a shared-prefix benchmark turns into a cache benchmark")),
            )
        )
        .otherwise(pl.format("{} ({} prompts); " + prod_text, bench_text, bench_kind))
    )
    bench_value = (
        pl.when(bench_kind == "trace")
        .then(pl.lit(ratio))
        .when(bench_kind == "unique")
        .then(pl.lit(0.0))
        .when(bench_kind == "shared")
        .then(pl.lit(1.0))
        .otherwise(None)
    )
    return _finding(profile, check, status, message, bench_value, ratio, PREFIX_HEAVY_SHARE)


def check_peak_rate(
    profile: pl.DataFrame, rates: Mapping[str, float], peak_label: str | None
) -> pl.DataFrame:
    """Production's peak against the highest load the sweep *sustained* within the SLO."""
    check = "peak_rate"
    if peak_label is None:
        return _no_facts(profile, check, "production peak rate")
    peak = rates[peak_label]
    top = pl.col("max_sustained_rate")
    tried = pl.col("max_open_rate")
    window = peak_label.removeprefix("peak_")
    prod = f"production peak ({window} window) is {peak:.4g} req/s"
    status = (
        pl.when(tried.is_null())
        .then(pl.lit("unknown"))
        .when(top.is_null() | (top < peak))
        .then(pl.lit("flag"))
        .otherwise(pl.lit("ok"))
    )
    message = (
        pl.when(tried.is_null())
        .then(pl.lit(f"no open-loop sweep; {prod}"))
        .when(top.is_null())
        .then(
            pl.format(
                "no open-loop point passed the SLO while keeping up (highest offered {} req/s); "
                + prod
                + ": the benchmark never showed any load sustained",
                decimal_expr(tried, 2),
            )
        )
        .otherwise(
            pl.format(
                "highest load sustained within the SLO {} req/s (highest offered {} req/s); "
                + prod
                + "{}",
                decimal_expr(top, 2),
                decimal_expr(tried, 2),
                pl.when(top < peak)
                .then(pl.lit(": the benchmark never showed production's peak rate sustained"))
                .otherwise(pl.lit("")),
            )
        )
    )
    return _finding(profile, check, status, message, top, peak, None)


def check_tail_sample(profile: pl.DataFrame, settings: BenchConfig) -> pl.DataFrame:
    """The SLO's highest percentile at each candidate's capacity point: judged from enough
    requests (``TAIL_REQUESTS_ABOVE`` expected above it), or said with its 95 % order-statistic
    interval in ranks of the sample (a p99 of 100 requests is their maximum)."""
    check = "tail_sample"
    slo = settings.slo
    tails = [limit for limit in slo.limits if limit.stat in PERCENTILE_SHARES]
    if not tails:
        return _unknown(profile, check, "the SLO judges no percentile")
    tail = max(tails, key=lambda limit: PERCENTILE_SHARES[limit.stat])
    share = PERCENTILE_SHARES[tail.stat]
    needed = -(-100 * TAIL_REQUESTS_ABOVE // (100 - share))
    label = tail.label(slo.itl_definition)
    rows = []
    for row in profile.iter_rows(named=True):
        n = row["capacity_requests"]
        if n is None:
            status, message = "unknown", f"no capacity point: {label} not judged"
        else:
            n = int(n)
            status = "ok" if n >= needed else "flag"
            message = (
                f"{label} at the capacity point rests on {n:,} requests "
                f"({interval_words(n, share, tail.stat)}); "
                + (
                    "enough for it"
                    if n >= needed
                    else f"about {needed:,} bound it ({interval_words(needed, share, tail.stat)})"
                )
            )
        rows.append(
            {
                "candidate": row["candidate"],
                "check": check,
                "status": status,
                "message": message,
                "bench_value": None if n is None else float(n),
                "prod_value": None,
                "threshold": float(needed),
            }
        )
    return pl.DataFrame(rows, schema=FINDINGS_SCHEMA)


def interval_words(n: int, share: int, stat: str) -> str:
    """The 95 % order-statistic interval of the ``share``-th percentile of ``n`` samples, in
    ranks of the sample."""
    lower, upper = order_statistic_interval(n, share / 100)
    low = f"the {_ordinal(lower)}" if lower is not None else "below the smallest"
    if upper is None:
        what = "maximum" if n * (100 - share) <= 100 else "upper tail"
        return (
            f"it is the sample's {what}: the 95 % order-statistic interval for the true {stat} "
            f"runs from {low} of {n:,} values to beyond the largest, unbounded above"
        )
    return (
        f"95 % order-statistic interval: the {stat} lies between the {_ordinal(lower)} and "
        f"{_ordinal(upper)} of {n:,} values"
    )


def _ordinal(rank: int | None) -> str:
    if rank is None:
        return "none"
    teens = rank % 100 // 10 == 1  # 11th, 12th, 13th
    suffix = "th" if teens else {1: "st", 2: "nd", 3: "rd"}.get(rank % 10, "th")
    return f"{rank:,}{suffix}"


def check_stale(profile: pl.DataFrame, as_of: dt.date | None, max_age_days: int) -> pl.DataFrame:
    check = "stale"
    run = pl.col("oldest_run")
    if as_of is None:
        return _unknown(
            profile,
            check,
            "no report date given (bench.as_of, --as-of or ENGINEFIT_RUN_DATE): the decision "
            "measures this age from its own date",
            float(max_age_days),
        )
    age = (pl.lit(as_of) - run).dt.total_days()
    status = (
        pl.when(run.is_null())
        .then(pl.lit("unknown"))
        .when(age > max_age_days)
        .then(pl.lit("flag"))
        .otherwise(pl.lit("ok"))
    )
    message = (
        pl.when(run.is_null())
        .then(pl.lit("run date not recorded (add run_date to the manifest): age unknown"))
        .otherwise(
            pl.format(
                "run on {}, {} days before {} (limit {} days){}",
                run.cast(pl.String),
                age,
                pl.lit(as_of.isoformat()),
                pl.lit(max_age_days),
                pl.when(age > max_age_days)
                .then(pl.lit(": older than six months, engines release every few weeks"))
                .otherwise(pl.lit("")),
            )
        )
    )
    return _finding(profile, check, status, message, age, None, float(max_age_days))


def check_closed_loop(profile: pl.DataFrame) -> pl.DataFrame:
    """Closed-loop points are flagged and reported apart; the message says what they hide."""
    closed = pl.col("n_closed") > 0
    message = (
        pl.when(closed)
        .then(
            pl.format(
                "{} closed-loop point(s) at concurrency {}{}: each user sends its next request "
                "only when the last one is answered, so requests never queue beyond that "
                "concurrency -- queueing and overload are hidden -- and the achieved rate is not "
                "an offered rate; reported apart, not ranked{}",
                pl.col("n_closed"),
                pl.col("closed_loads"),
                pl.when(pl.col("n_open") == 0)
                .then(pl.lit(" and no open-loop sweep"))
                .otherwise(pl.lit("")),
                pl.when(pl.col("min_closed_load") == 1)
                .then(
                    pl.lit(
                        "; at concurrency 1 one request is in flight at a time: its latency is "
                        "the unloaded latency and says nothing about latency under load"
                    )
                )
                .otherwise(pl.lit("")),
            )
        )
        .when(pl.col("n_open") > 0)
        .then(pl.format("{} open-loop point(s), no closed-loop points", pl.col("n_open")))
        .otherwise(
            pl.format(
                "no closed-loop points; no open-loop sweep either: {} burst / ramp / trace "
                "point(s), which have no single load to search",
                pl.col("n_other"),
            )
        )
    )
    return _finding(
        profile,
        "closed_loop",
        pl.when(closed).then(pl.lit("flag")).otherwise(pl.lit("ok")),
        message,
        pl.col("n_closed"),
        None,
        None,
    )


def comparability(evaluated: pl.DataFrame) -> tuple[bool, list[str]]:
    """Whether the candidates can be ranked, and what differs between them (with values)."""
    frame = evaluated.with_columns(candidate=candidate_label_expr(evaluated))
    n_candidates = frame.get_column("candidate").n_unique()
    if n_candidates < 2:
        return True, []
    present = [c for c in COMPARABILITY_FIELDS if c in frame.columns]
    differences: list[str] = []
    for name in present:
        values = (
            frame.group_by("candidate")
            .agg(pl.col(name).cast(pl.String).drop_nulls().unique().sort().str.join("|"))
            .sort("candidate")
        )
        distinct = values.get_column(name).unique()
        if distinct.len() > 1:
            parts = [
                f"{row['candidate']}: {row[name] or 'not recorded'}"
                for row in values.iter_rows(named=True)
            ]
            differences.append(f"{name} differs ({'; '.join(parts)})")
    return not differences, differences


def check_comparability(evaluated: pl.DataFrame) -> pl.DataFrame:
    comparable, differences = comparability(evaluated)
    n = (
        evaluated.select(candidate_label_expr(evaluated).n_unique()).item()
        if evaluated.height
        else 0
    )
    if n < 2:
        status, message = "ok", f"{n} candidate(s): nothing to compare"
    elif comparable:
        status = "ok"
        message = f"{n} candidates share {', '.join(COMPARABILITY_FIELDS)} (where recorded)"
    else:
        status = "flag"
        message = "not comparable, so not ranked: " + "; ".join(differences)
    return pl.DataFrame(
        {
            "candidate": [ALL_CANDIDATES],
            "check": ["comparability"],
            "status": [status],
            "message": [message],
            "bench_value": [float(n)],
            "prod_value": [None],
            "threshold": [None],
        },
        schema=FINDINGS_SCHEMA,
    )


def validity_findings(
    evaluated: pl.DataFrame,
    facts: WorkloadFacts | None,
    settings: BenchConfig,
    *,
    as_of: dt.date | None,
    rates: Mapping[str, float] | None = None,
) -> pl.DataFrame:
    """Every check for every candidate (rows sorted by candidate, check)."""
    if evaluated.height == 0:
        return pl.DataFrame(schema=FINDINGS_SCHEMA)
    profile = candidate_profile(evaluated)
    if rates is None:
        rates = (
            workload_rates(facts.mean_rate_rps, facts.peak_rate_rps, settings.peak_window)
            if facts
            else {}
        )
    peak_label = next((k for k in rates if k.startswith("peak_")), None)
    parts = [
        check_fixed_length(profile, facts, TAIL_RATIO),
        check_length(profile, facts, LENGTH_FACTOR, which="prompt"),
        check_length(profile, facts, LENGTH_FACTOR, which="output"),
        check_prefix(profile, facts),
        check_peak_rate(profile, rates, peak_label),
        check_stale(profile, as_of, settings.max_age_days),
        check_tail_sample(profile, settings),
        check_closed_loop(profile),
        check_comparability(evaluated),
    ]
    return pl.concat(
        [p.select(pl.col(c).cast(t) for c, t in FINDINGS_SCHEMA.items()) for p in parts]
    ).sort(["candidate", "check"])
