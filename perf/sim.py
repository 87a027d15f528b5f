"""Prefix-cache replay speed: the pure-Python references against the numba event kernel.

Run: ``.venv/bin/python -m perf.sim [--requests N] [--large-compare N] [--big N]``.
Prints, side by side on the same generated workload (block size 16), for both request
lifetimes (``instant``: blocks released at arrival; ``durations``: pinned until each request
finishes, ``replica_slots`` 64): seconds per scenario for the reference (tests/sim_oracles.py:
an OrderedDict LRU, and the event-driven rules with ref counts) and for ours (1 replica, 4
replicas round-robin and affinity), the all-capacity curve against one instant scenario, the
cache-aware router, SHARDS, and optionally a large generated trace end to end. The results
must agree per request, to the token, before any time is reported. Run it from the repository
root (the references live under tests/).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from pipeline.config import default_config
from pipeline.schema import conform
from pipeline.sim import (
    BlockView,
    Scenario,
    SimInput,
    assign,
    capacity_curve,
    sim_input,
    simulate,
)
from pipeline.sim.curve import Curve
from tests.sim_oracles import event_reference, lru_reference

B = 16
SLOTS = 64
LIFETIMES = ("instant", "durations")
DEFAULTS = default_config()
BASE = DEFAULTS.simulation.replace(replica_slots=SLOTS)
SETTINGS = {lifetime: BASE.replace(request_lifetime=lifetime) for lifetime in LIFETIMES}


def _input(frame: pl.DataFrame) -> SimInput:
    return sim_input(frame, latency_model=DEFAULTS.simulation.latency(DEFAULTS.shape.latency))


def generate(n: int, seed: int = 0, block_size: int = B) -> pl.DataFrame:
    """A conversational workload built in numpy (no Python object per request).

    32 shared system prompts (2-40 blocks); n/6 conversations, each on one system prompt,
    growing 1-4 blocks per turn (capped at 400 blocks); arrivals ~ Poisson at 50 req/s;
    output 20-400 tokens whose blocks are unknown (they occupy capacity, never match).
    Block keys follow the chained-hash structure: a prefix is identified by (system, k) inside
    the system prompt and by (conversation, k) after it.
    """
    rng = np.random.default_rng(seed)
    n_sys = 32
    n_conv = max(1, n // 6)
    sys_len = rng.integers(2, 41, n_sys)
    conv_sys = rng.integers(0, n_sys, n_conv)
    conv_growth = rng.integers(1, 5, n_conv)
    conv = rng.integers(0, n_conv, n)
    order = np.argsort(conv, kind="stable")
    sorted_conv = conv[order]
    starts = np.flatnonzero(np.r_[True, sorted_conv[1:] != sorted_conv[:-1]])
    group_start = np.repeat(starts, np.diff(np.r_[starts, n]))
    turn = np.empty(n, np.int64)
    turn[order] = np.arange(n) - group_start
    s = conv_sys[conv]
    prompt_blocks = np.minimum(sys_len[s] + (turn + 1) * conv_growth[conv], 400)
    prompt_tokens = prompt_blocks * block_size + rng.integers(0, block_size, n)
    output_tokens = rng.integers(20, 401, n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(prompt_blocks, out=offsets[1:])
    keys = np.empty(int(offsets[-1]), np.uint64)
    step = 500_000  # build the chains a chunk of requests at a time to bound memory
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        req = np.repeat(np.arange(lo, hi), prompt_blocks[lo:hi])
        k = np.arange(offsets[lo], offsets[hi], dtype=np.int64) - offsets[req]
        owner = np.where(k < sys_len[s[req]], s[req], n_sys + conv[req]).astype(np.uint64)
        chunk = (owner << np.uint64(20)) | k.astype(np.uint64)
        # make them look like hashes (a bijection, so no collisions)
        keys[offsets[lo] : offsets[hi]] = chunk * np.uint64(0x9E3779B97F4A7C15) ^ (
            chunk >> np.uint64(29)
        )
    chains = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(keys, pa.uint64()))
    arrival_us = np.cumsum(rng.exponential(20_000, n)).astype(np.int64)
    t0 = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1_000_000)
    frame = pl.DataFrame(
        {
            "arrival": pl.Series(arrival_us + t0).cast(pl.Datetime("us", "UTC")),
            "session_id": pl.Series(conv).cast(pl.String),
            "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens,
            "block_size": np.full(n, block_size, np.int32),
            "prefix_hashes": pl.Series(chains),
            "prompt_blocks": prompt_blocks.astype(np.int32),
            "hashes_known": np.ones(n, bool),
        }
    ).with_columns(pl.format("g{}", pl.int_range(pl.len())).alias("request_id"))
    return conform(frame)


def one_replica_curve(inp: SimInput, sample_rate: float = 1.0) -> Curve:
    return capacity_curve(
        inp,
        SETTINGS["instant"],
        block_size=B,
        replicas=1,
        routing="round-robin",
        sample_rate=sample_rate,
    )


def _timed(fn: Callable[[], Any], repeat: int = 1) -> tuple[float, Any]:
    best = float("inf")
    result: Any = None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


FAIRNESS = (
    "  (both sides replay the same block stream: dense block ids per request, built once by "
    "SimInput.blocks and excluded from both timings;\n   ours = the whole simulate() call "
    "for one lifetime incl. grouping requests by replica; reference = tests/sim_oracles.py "
    "over prebuilt Python lists:\n   instant = OrderedDict LRU, durations = ref counts + "
    "free OrderedDict + finish heap)"
)


def reference_hits(
    inp: SimInput,
    view: BlockView,
    chains: list[list[int]],
    lifetime: str,
    capacity: int,
    replica: list[int],
    replicas: int,
) -> list[int]:
    """Per-request hit tokens of the pure-Python reference for one lifetime."""
    pb = view.prompt_blocks.tolist()
    missing = view.missing.tolist()
    ptok = inp.prompt_tokens.tolist()
    if lifetime == "instant":
        return lru_reference(chains, pb, missing, ptok, B, capacity, replica, replicas)
    return event_reference(
        chains,
        pb,
        missing,
        ptok,
        B,
        capacity,
        arrival=inp.arrival_us.tolist(),
        duration=inp.duration_us.tolist(),
        replicas=replicas,
        replica=replica,
        replica_slots=SLOTS,
    ).hit_tokens


def compare(
    n: int,
    cache_tokens: int,
    routings: tuple[tuple[int, str], ...] | None = None,
    *,
    extras: bool = True,
) -> None:
    frame = generate(n, seed=1)
    inp = _input(frame)
    view = inp.blocks(B)
    chains = [view.ids[view.offsets[i] : view.offsets[i + 1]].tolist() for i in range(inp.n)]
    accesses = view.accesses
    print(
        f"workload: {n:,} requests, {int(view.ids.size):,} chain blocks, {accesses:,} block "
        f"accesses (incl. unknown output blocks), {view.n_ids:,} distinct blocks, B={B}, "
        f"cache {cache_tokens:,} tokens per replica"
    )
    print(FAIRNESS)
    grid = routings or ((1, "round-robin"), (4, "round-robin"), (4, "affinity"))
    instant_s: dict[tuple[int, str], float] = {}
    for lifetime in LIFETIMES:
        for replicas, routing in grid:
            sc = Scenario(B, replicas, cache_tokens, routing)
            a = assign(inp, routing, replicas, SETTINGS[lifetime])
            ours = partial(simulate, inp, sc, SETTINGS[lifetime], assignment=a, with_instant=False)
            ours()  # compile + warm
            ours_s, run = _timed(ours, repeat=3)
            if lifetime == "instant":
                instant_s[(replicas, routing)] = ours_s
            ref = partial(
                reference_hits,
                inp,
                view,
                chains,
                lifetime,
                cache_tokens // B,
                a.replica.tolist(),
                replicas,
            )
            ref_s, ref_hits = _timed(ref)
            assert ref_hits == run.hit_tokens.tolist(), lifetime
            print(
                f"  {lifetime:<9} R={replicas} {routing:<12} reference {ref_s:8.2f} s   ours "
                f"{ours_s:8.4f} s   speed-up {ref_s / ours_s:7.1f}x   "
                f"({accesses / ours_s / 1e6:6.1f} M accesses/s)   hit ratio "
                f"{run.hit_tokens.sum() / inp.prompt_tokens.sum():.4f} (equal per request)"
            )
    for replicas, routing in grid:
        sc = Scenario(B, replicas, cache_tokens, routing)
        instant = SETTINGS["instant"]
        a = assign(inp, routing, replicas, instant)
        run = simulate(inp, sc, instant, assignment=a)
        every = partial(
            capacity_curve,
            inp,
            instant,
            block_size=B,
            replicas=replicas,
            routing=routing,
            assignment=a,
        )
        every()
        curve_s, curve = _timed(every, repeat=3)
        assert curve.hit_tokens_at(cache_tokens) == int(run.hit_tokens.sum())
        one_s = instant_s[(replicas, routing)]
        print(
            f"  curve R={replicas} {routing:<12} all capacities {curve_s:7.3f} s vs one instant "
            f"scenario {one_s:7.3f} s = {curve_s / one_s:4.2f}x ({curve.capacity_blocks.size:,} "
            "steps; equal at this capacity)"
        )
    if not extras:
        return
    sc = Scenario(B, 4, cache_tokens, "cache-aware")
    for lifetime in LIFETIMES:
        routed = partial(simulate, inp, sc, SETTINGS[lifetime], with_instant=False)
        routed()
        t, run = _timed(routed)
        print(
            f"  {lifetime:<9} R=4 cache-aware (router inside the replay): {t:.3f} s, hit ratio "
            f"{run.hit_tokens.sum() / inp.prompt_tokens.sum():.4f}, balance-routed "
            f"{run.balance_routed:,}"
        )
    exact = one_replica_curve(inp)
    for rate in (0.1, 0.01):
        sampled_curve = partial(one_replica_curve, inp, sample_rate=rate)
        sampled_curve()  # compile + warm
        s_t, sampled = _timed(sampled_curve)
        caps = np.geomspace(1024, max(exact.saturation_cache_tokens, 2048), 40).astype(np.int64)
        err = [abs(exact.hit_ratio_at(int(c)) - sampled.hit_ratio_at(int(c))) for c in caps]
        print(
            f"  SHARDS rate {rate}: {s_t:.3f} s; |hit-ratio error| over 40 capacities from 1,024 "
            f"tokens: mean {np.mean(err):.4f}, max {np.max(err):.4f}"
        )


def big(n: int, cache_tokens: int) -> None:
    t, frame = _timed(partial(generate, n, seed=2))
    print(f"large trace: {n:,} requests generated in {t:.1f} s")
    start = time.perf_counter()
    inp = _input(frame)
    t = time.perf_counter() - start
    del frame
    print(f"  flatten to arrays: {t:.1f} s")
    t, view = _timed(partial(inp.blocks, B))
    print(
        f"  dense ids (hash once): {t:.1f} s; {int(view.ids.size):,} chain blocks, "
        f"{view.accesses:,} accesses, {view.n_ids:,} distinct"
    )
    single = 0.0
    for replicas, routing in ((1, "round-robin"), (4, "affinity"), (4, "cache-aware")):
        for lifetime in LIFETIMES:
            sc = Scenario(B, replicas, cache_tokens, routing)
            t, run = _timed(partial(simulate, inp, sc, SETTINGS[lifetime], with_instant=False))
            if lifetime == "instant" and replicas == 1:
                single = t
            print(
                f"  scenario {lifetime:<9} R={replicas} {routing:<12} {cache_tokens:,} "
                f"tokens/replica: {t:6.1f} s, hit ratio "
                f"{run.hit_tokens.sum() / inp.prompt_tokens.sum():.4f}"
            )
    t, curve = _timed(partial(one_replica_curve, inp))
    print(
        f"  curve (1 replica, every capacity): {t:6.1f} s = {t / single:.2f}x the R=1 instant "
        f"scenario; hit ratio at {cache_tokens:,} tokens {curve.hit_ratio_at(cache_tokens):.4f}, "
        f"max {curve.max_hit_tokens / curve.prompt_tokens:.4f}, "
        f"{curve.capacity_blocks.size:,} steps"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--cache-tokens", type=int, default=2_000_000)
    parser.add_argument("--big", type=int, default=0, help="large trace end to end; 0 skips")
    parser.add_argument(
        "--large-compare", type=int, default=1_000_000, help="reference vs ours, 1 replica; 0 skips"
    )
    args = parser.parse_args(argv if argv is not None else [])
    compare(args.requests, args.cache_tokens)
    if args.large_compare:
        compare(args.large_compare, 16_000_000, routings=((1, "round-robin"),), extras=False)
    if args.big:
        big(args.big, 16_000_000)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
