"""Benchmark: prefix-sharing curve, reuse potential and session inference on a generated trace.

The trace (default 10M requests, block size 16) is built in numpy chunks of conversations:
each conversation starts with one of a few shared system prompts, then every turn's prompt is
the whole history (previous prompt + answer) plus a new user message, so turn t+1's hash chain
extends turn t's prompt-and-output chain. Hashes are a 64-bit mix of (owner, block index): a
system prompt's full blocks are shared by all its conversations, the rest belong to one
conversation; each conversation belongs to one of 8 tenants. Conversations start uniformly
over a day; turns follow after exponential think
times. Prints wall time per step and peak RSS.

Run: ``.venv/bin/python -m perf.prefix [--requests N] [--block-size B]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import resource
import sys
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.config import default_config
from pipeline.prefix import (
    classify_curve,
    reuse_per_request,
    reuse_summary,
    sharing_curve,
)
from pipeline.schema import conform
from pipeline.sessions import infer_sessions

DAY_US = 86_400 * 1_000_000
N_SYSTEM_PROMPTS = 40
N_TENANTS = 8


def _mix(a: npt.NDArray[np.uint64], b: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64 of (a, b): distinct pairs give distinct-looking 64-bit ids."""
    with np.errstate(over="ignore"):
        z = a * np.uint64(0x9E3779B97F4A7C15) + b + np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def generate(n_requests: int, block_size: int, seed: int = 7) -> pl.DataFrame:
    """A canonical table of about ``n_requests`` requests, sorted by arrival."""
    rng = np.random.default_rng(seed)
    sys_tokens = rng.integers(50, 600, N_SYSTEM_PROMPTS)
    turns_per_conv = np.minimum(rng.geometric(0.5, size=n_requests), 30)
    n_convs = int(np.searchsorted(np.cumsum(turns_per_conv), n_requests)) + 1
    turns_per_conv = turns_per_conv[:n_convs]
    turns_per_conv[-1] -= int(turns_per_conv.sum()) - n_requests
    n = n_requests
    conv = np.repeat(np.arange(n_convs, dtype=np.int64), turns_per_conv)
    first = np.cumsum(turns_per_conv) - turns_per_conv
    turn = np.arange(n, dtype=np.int64) - np.repeat(first, turns_per_conv)
    system = rng.integers(0, N_SYSTEM_PROMPTS, n_convs)[conv]
    tenant = rng.integers(0, N_TENANTS, n_convs)[conv]
    message = rng.integers(10, 200, n)
    output = rng.integers(20, 300, n)
    # History before turn t's message: system + sum of earlier (message + output) of the conv.
    step = message + output
    cum = np.cumsum(step) - step
    history = sys_tokens[system] + cum - np.repeat(cum[first], turns_per_conv)
    prompt = history + message
    start = rng.integers(0, DAY_US, n_convs)[conv]
    think = rng.exponential(30e6, n).astype(np.int64)
    think[turn == 0] = 0
    cthink = np.cumsum(think)
    arrival = start + cthink - np.repeat(cthink[first], turns_per_conv)
    order = np.argsort(arrival, kind="stable")

    conv, system, tenant, prompt, output, arrival = (
        conv[order],
        system[order],
        tenant[order],
        prompt[order],
        output[order],
        arrival[order],
    )
    n_blocks = (prompt + output) // block_size
    sys_blocks = sys_tokens[system] // block_size
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(n_blocks, out=offsets[1:])
    values = np.empty(int(offsets[-1]), dtype=np.uint64)
    chunk = 1_000_000
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        lens = n_blocks[lo:hi]
        j = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(
            offsets[lo:hi] - offsets[lo], lens
        )
        shared = j < np.repeat(sys_blocks[lo:hi], lens)
        owner = np.where(
            shared,
            np.repeat(system[lo:hi], lens).astype(np.uint64),
            np.repeat(conv[lo:hi], lens).astype(np.uint64) + np.uint64(1 << 40),
        )
        values[offsets[lo] : offsets[hi]] = _mix(owner, j.astype(np.uint64))
    hashes = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))
    frame = pl.DataFrame(
        {
            "request_id": pl.int_range(n, eager=True).cast(pl.String),
            "arrival": pl.Series(arrival, dtype=pl.Int64).cast(pl.Datetime("us", "UTC"))
            + dt.timedelta(days=20454),
            "tenant": pl.Series(tenant).cast(pl.String),
            "prompt_tokens": prompt,
            "output_tokens": output,
            "block_size": np.full(n, block_size, dtype=np.int32),
            "prefix_hashes": pl.Series(hashes),
            "prompt_blocks": (prompt // block_size).astype(np.int32),
            "hashes_known": np.ones(n, dtype=np.bool_),
        }
    )
    return conform(frame)


def _rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000_000)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args(argv)
    config = default_config().prefix
    t0 = time.perf_counter()
    requests = generate(args.requests, args.block_size)
    t_gen = time.perf_counter() - t0
    total_blocks = int(requests["prefix_hashes"].list.len().sum())
    mean_prompt = float(requests["prompt_tokens"].mean() or 0)  # type: ignore[arg-type]
    print(
        f"generated {requests.height:,} requests, {total_blocks:,} blocks "
        f"(mean prompt {mean_prompt:.0f} tokens) in {t_gen:.1f} s; "
        f"peak RSS {_rss_gib():.2f} GiB"
    )
    t0 = time.perf_counter()
    sessions = infer_sessions(requests, min_blocks=config.min_session_match_blocks)
    t_sess = time.perf_counter() - t0
    print(
        f"infer_sessions: {t_sess:.1f} s, {sessions['session_id'].n_unique():,} sessions; "
        f"peak RSS {_rss_gib():.2f} GiB"
    )
    del sessions
    t0 = time.perf_counter()
    curve = sharing_curve(requests, args.block_size)
    t_curve = time.perf_counter() - t0
    median = float(requests["prompt_tokens"].median() or 0)  # type: ignore[arg-type]
    shape = classify_curve(curve, median, config)
    print(
        f"sharing_curve: {t_curve:.1f} s, {curve.height} windows, shape {shape['shape']!r}; "
        f"peak RSS {_rss_gib():.2f} GiB"
    )
    t0 = time.perf_counter()
    per = reuse_per_request(requests, args.block_size, config.reuse_age_buckets_s)
    summary = reuse_summary(per, config.reuse_age_buckets_s)
    t_reuse = time.perf_counter() - t0
    print(
        f"reuse_per_request + summary: {t_reuse:.1f} s, hit share {summary['hit_share']:.3f}, "
        f"cross-tenant share of hits {summary['cross_tenant']['cross_tenant_share_of_hits']:.3f}; "
        f"peak RSS {_rss_gib():.2f} GiB"
    )
    print(f"total (without generation): {t_sess + t_curve + t_reuse:.1f} s")


if __name__ == "__main__":
    main()
