"""Benchmark: prefix-sharing curve, reuse potential and session inference on a generated trace.

The trace (default 10M requests, block size 16) is ``perf.workload``'s model at its ``short``
profile, as the canonical table: multi-turn conversations on 16 Zipf-popular shared system
prompts, every turn's prompt the whole history (previous prompt + answer) plus a new user
message, so turn t+1's chain extends turn t's prompt-and-output chain (keys are a 64-bit mix of
(owner, block index)); each conversation belongs to one of 8 tenants; Poisson session starts at
100 requests/s, exponential think times; no session ids logged. Prints wall time per step and
peak RSS.

Run: ``.venv/bin/python -m perf.prefix [--requests N] [--block-size B]``.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perf.workload import canonical_frame, conversations, spec
from pipeline.config import default_config
from pipeline.prefix import (
    classify_curve,
    reuse_per_request,
    reuse_summary,
    sharing_curve,
)
from pipeline.sessions import infer_sessions

SEED = 7
TENANTS = 8


def generate(n_requests: int, block_size: int, seed: int = SEED) -> pl.DataFrame:
    """The canonical table of ``perf.workload``'s short-context conversations (``n_requests``
    requests, 8 tenants, answers in the chain, no session ids), sorted by arrival."""
    drawn = conversations(spec(n_requests, "short", seed=seed, tenants=TENANTS))
    return canonical_frame(drawn, block_size)


def _rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000_000)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args(argv if argv is not None else [])
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
    main(sys.argv[1:])
