"""The shape metrics the way a quick script computes them: ``csv``, loops, dicts, ``statistics``.

The baseline ``perf/shape.py`` times beside the shape stage, on the same generated requests
(the CSV export of ``perf.workload``: ``arrival_us, session_id, tenant, model, prompt_tokens,
output_tokens``). It computes the figures a person would script first, with the stage's
definitions so the two can be checked against each other (``pipeline/shape``):

* requests, span, mean rate; per 1 s / 10 s / 60 s epoch-aligned window (empty windows between
  the first and last counted as zeros): peak count, mean count, index of dispersion
  (population variance / mean);
* gaps between consecutive arrivals: mean, population standard deviation, CV;
* prompt and output tokens: mean, p50/p90/p95/p99 (the sorted value at index
  ⌊(n − 1)·q + 0.5⌋, the stage's ``nearest``) and max;
* peak and mean concurrency: each request busy over [arrival, arrival + duration), duration
  = base + per-prompt-token × prompt + per-output-token × (output − 1) ms (the stage's latency
  model), ends before starts at equal instants;
* sessions, sessions of more than one turn, distinct tenants and models.

Run: ``python perf/shape_baseline.py REQUESTS.csv [--latency 50,0.05,30]`` (prints JSON).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

WINDOWS_S = (1, 10, 60)
PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99))


def read_requests(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(newline="") as handle:
        for record in csv.DictReader(handle):
            rows.append(
                {
                    "arrival_us": int(record["arrival_us"]),
                    "session_id": record["session_id"] or None,
                    "tenant": record["tenant"] or None,
                    "model": record["model"] or None,
                    "prompt_tokens": int(record["prompt_tokens"]),
                    "output_tokens": int(record["output_tokens"])
                    if record["output_tokens"]
                    else None,
                }
            )
    return rows


def percentile(ordered: list[int], q: float) -> int:
    return ordered[int((len(ordered) - 1) * q + 0.5)]


def lengths(values: list[int]) -> dict[str, float]:
    ordered = sorted(values)
    out = {"mean": statistics.fmean(ordered)}
    for name, q in PERCENTILES:
        out[name] = percentile(ordered, q)
    out["max"] = ordered[-1]
    return out


def shape_metrics(
    rows: list[dict[str, Any]], latency: tuple[float, float, float]
) -> dict[str, float]:
    """Flat ``name: value`` figures of ``rows`` (keys as in :func:`stage_figures`)."""
    arrivals = sorted(row["arrival_us"] for row in rows)
    n = len(arrivals)
    span_s = (arrivals[-1] - arrivals[0]) / 1e6
    out: dict[str, float] = {"requests": n, "span_s": span_s, "mean_rate_rps": n / span_s}
    for window in WINDOWS_S:
        counts: dict[int, int] = {}
        for t in arrivals:
            bucket = t // (window * 1_000_000)
            counts[bucket] = counts.get(bucket, 0) + 1
        # Complete windows only (unquantised arrivals): inside [first arrival, last arrival].
        first = -(-arrivals[0] // (window * 1_000_000))
        last = arrivals[-1] // (window * 1_000_000) - 1
        series = [counts.get(b, 0) for b in range(first, last + 1)]
        mean = statistics.fmean(series)
        out[f"window_{window}s_peak_count"] = max(series)
        out[f"window_{window}s_mean_count"] = mean
        out[f"window_{window}s_index_of_dispersion"] = statistics.pvariance(series) / mean
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    mean_gap = statistics.fmean(gaps)
    std_gap = statistics.pstdev(gaps)
    out["gap_mean_s"] = mean_gap / 1e6
    out["gap_std_s"] = std_gap / 1e6
    out["gap_cv"] = std_gap / mean_gap
    for column in ("prompt_tokens", "output_tokens"):
        values = [row[column] for row in rows if row[column] is not None]
        for name, value in lengths(values).items():
            out[f"{column}_{name}"] = value
    base, per_prompt, per_output = latency
    events = []
    busy = 0
    for row in rows:
        output = row["output_tokens"] or 0
        ms = base + per_prompt * float(row["prompt_tokens"]) + per_output * max(output - 1.0, 0.0)
        end = row["arrival_us"] + round(ms * 1000.0)
        busy += end - row["arrival_us"]
        events.append((row["arrival_us"], 1))
        events.append((end, -1))  # sorts before a start at the same instant
    events.sort()
    level = peak = 0
    for _, change in events:
        level += change
        peak = max(peak, level)
    out["concurrency_peak"] = peak
    out["concurrency_mean"] = busy / (events[-1][0] - arrivals[0])
    turns: dict[str, int] = {}
    tenants, models = set(), set()
    for row in rows:
        if row["session_id"] is not None:
            turns[row["session_id"]] = turns.get(row["session_id"], 0) + 1
        if row["tenant"] is not None:
            tenants.add(row["tenant"])
        if row["model"] is not None:
            models.add(row["model"])
    out["sessions"] = len(turns)
    out["multi_turn_sessions"] = sum(1 for t in turns.values() if t > 1)
    out["tenants"] = len(tenants)
    out["models"] = len(models)
    return out


def stage_figures(metrics: dict[str, Any]) -> dict[str, float]:
    """The same figures read from the shape stage's ``workload_shape.json`` metrics."""
    arrivals = metrics["arrivals"]
    out: dict[str, float] = {
        "requests": metrics["requests"],
        "span_s": arrivals["span_s"],
        "mean_rate_rps": arrivals["mean_rate_rps"],
    }
    for window in WINDOWS_S:
        stats = arrivals["windows"][f"{window}s"]
        out[f"window_{window}s_peak_count"] = stats["peak_count"]
        out[f"window_{window}s_mean_count"] = stats["mean_count"]
        out[f"window_{window}s_index_of_dispersion"] = stats["index_of_dispersion"]
    gaps = arrivals["inter_arrival"]
    out["gap_mean_s"] = gaps["mean_gap_s"]
    out["gap_std_s"] = gaps["std_gap_s"]
    out["gap_cv"] = gaps["cv"]
    for column in ("prompt_tokens", "output_tokens"):
        dist = metrics["lengths"][column]
        for name in ("mean", *(p for p, _ in PERCENTILES), "max"):
            out[f"{column}_{name}"] = dist[name]
    out["concurrency_peak"] = metrics["concurrency"]["peak"]
    out["concurrency_mean"] = metrics["concurrency"]["mean"]
    sessions = metrics["sessions"]
    out["sessions"] = sessions["sessions"] if sessions["known"] else 0
    out["multi_turn_sessions"] = sessions["multi_turn_sessions"] if sessions["known"] else 0
    out["tenants"] = metrics["tenants"]["distinct"]
    out["models"] = metrics["models"]["distinct"]
    return out


def disagreements(ours: dict[str, float], stage: dict[str, float], rel: float = 1e-9) -> list[str]:
    """Figures that differ by more than ``rel`` (relative) or are missing on one side."""
    bad = []
    for key in sorted(ours.keys() | stage.keys()):
        a, b = ours.get(key), stage.get(key)
        if a is None or b is None or not math.isclose(a, b, rel_tol=rel, abs_tol=1e-12):
            bad.append(f"{key}: baseline {a!r}, stage {b!r}")
    return bad


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument(
        "--latency", default="50,0.05,30", help="base ms, ms per prompt token, ms per output token"
    )
    args = parser.parse_args(argv if argv is not None else [])
    base, per_prompt, per_output = (float(v) for v in args.latency.split(","))
    start = time.perf_counter()
    rows = read_requests(args.csv)
    read_s = time.perf_counter() - start
    start = time.perf_counter()
    figures = shape_metrics(rows, (base, per_prompt, per_output))
    compute_s = time.perf_counter() - start
    print(json.dumps({"read_s": read_s, "compute_s": compute_s, "figures": figures}))


if __name__ == "__main__":
    main(sys.argv[1:])
