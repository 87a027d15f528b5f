"""Prefix-cache replay speed: the pure-Python references against the numba event kernel, and
the commands as a new user runs them.

Run: ``.venv/bin/python -m perf.sim [--requests N] [--large-compare N] [--big N]
[--process-sizes N,N] [--baseline DIR]``.

Every trace is ``perf.workload``'s model (short profile): multi-turn conversations on shared
system prompts, each turn's prompt the history plus a new message.

Whole process (``process``): a generated trace with no session ids logged, block size 16 —
``conversations`` (``perf.prefix.generate``: each answer in the chain the next turn extends)
and ``prompts-only`` (formerly ``synthetic``; the kernel comparison's workload below: only the
prompts' blocks in the chain, answers unknown, as Mooncake logs them) — is written as canonical
Parquet, then ``enginefit simulate
TRACE`` (the default durations lifetime, which reports the instant figures too; and
``--request-lifetime instant``) and ``enginefit curve TRACE`` run as child processes from an
empty folder (built-in defaults), imports included, best of three. Beside them: the phases in
process, and the pure-Python OrderedDict LRU of perf/sim_oracles.py alone on the same blocks
(its instant hit tokens must equal the commands' exactly). ``--baseline DIR`` (or
``PERF_BASELINE``) times the same commands on another checkout's code (say the main branch's
worktree) in the same run, interleaved.

Kernels (``compare``): side by side on the same generated workload (block size 16), for both request
lifetimes (``instant``: blocks released at arrival; ``durations``: pinned until each request
finishes, ``replica_slots`` 64): seconds per scenario for the reference (perf/sim_oracles.py:
an OrderedDict LRU, and the event-driven rules with ref counts) and for ours (1 replica, 4
replicas round-robin and affinity), the all-capacity curve against one instant scenario, the
cache-aware router, SHARDS, and optionally a large generated trace end to end. The results
must agree per request, to the token, before any time is reported. Run it from the repository
root.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from perf.prefix import generate as conversation_trace
from perf.sim_oracles import event_reference, lru_reference
from perf.workload import canonical_frame, conversations, spec
from pipeline.config import default_config
from pipeline.sim.blocks import BlockView, SimInputs, sim_input
from pipeline.sim.config import Scenario
from pipeline.sim.curve import Curve, capacity_curve
from pipeline.sim.replay import assign, simulate, summarise

ROOT = Path(__file__).resolve().parents[1]

B = 16
SLOTS = 64
LIFETIMES = ("instant", "durations")
DEFAULTS = default_config()
BASE = DEFAULTS.simulation.replace(replica_slots=SLOTS)
SETTINGS = {lifetime: BASE.replace(request_lifetime=lifetime) for lifetime in LIFETIMES}


def _input(frame: pl.DataFrame) -> SimInputs:
    return sim_input(frame, latency_model=DEFAULTS.simulation.latency(DEFAULTS.shape.latency))


def generate(n: int, seed: int = 0, block_size: int = B) -> pl.DataFrame:
    """``perf.workload``'s short-context conversations as the canonical table, with their
    session ids logged and only the prompts' blocks in the chains: the answers' blocks are
    unknown (they occupy capacity, never match), as in a Mooncake-style trace."""
    drawn = conversations(spec(n, "short", seed=seed))
    return canonical_frame(drawn, block_size, answers_in_chain=False, sessions=True)


def one_replica_curve(inp: SimInputs, sample_rate: float = 1.0) -> Curve:
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
    "SimInputs.blocks and excluded from both timings;\n   ours = the whole simulate() call "
    "for one lifetime incl. grouping requests by replica; reference = perf/sim_oracles.py "
    "over prebuilt Python lists:\n   instant = OrderedDict LRU, durations = ref counts + "
    "free OrderedDict + finish heap)"
)


def reference_hits(
    inp: SimInputs,
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


def _command(code: Path, args: list[str], cwd: Path) -> tuple[float, Any]:
    """Wall seconds of one ``enginefit`` process on ``code``'s pipeline (imports included) and
    its JSON output."""
    script = Path(sys.executable).with_name("enginefit")
    launcher = (
        [str(script)]
        if script.exists()
        else [sys.executable, "-c", "import sys; from assets.cli import main; sys.exit(main())"]
    )
    env = {**os.environ, "PYTHONPATH": str(code)}
    start = time.perf_counter()
    done = subprocess.run(
        [*launcher, *args, "--json"], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"enginefit {' '.join(args)} failed on {code}: {done.stderr}")
    return seconds, json.loads(done.stdout)


def _phases(path: Path, cache_tokens: int) -> list[tuple[str, float]]:
    """What ``enginefit simulate`` and ``enginefit curve`` spend their time on, in process."""
    settings = DEFAULTS.simulation
    out: list[tuple[str, float]] = []

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        result = fn()
        out.append((name, time.perf_counter() - start))
        return result

    frame = timed("read Parquet", lambda: pl.read_parquet(path))
    inp = timed("flatten (sim_input)", partial(_input, frame))
    del frame
    view = timed("dense block ids", lambda: inp.blocks(B))
    sc = Scenario(B, 1, cache_tokens, "round-robin")
    durations = settings.replace(request_lifetime="durations")
    run = timed("replay, durations", lambda: simulate(inp, sc, durations, with_instant=False))
    instant = settings.replace(request_lifetime="instant")
    timed("replay, instant", lambda: simulate(inp, sc, instant))
    timed("summary", lambda: summarise(inp, run))
    timed("curve: chain check", lambda: view.chained)
    timed(
        "curve: one pass",
        lambda: capacity_curve(inp, settings, block_size=B, replicas=1, routing="round-robin"),
    )
    return out


def _reference(path: Path, cache_tokens: int) -> tuple[float, int, int]:
    """Seconds of the pure-Python OrderedDict LRU alone (chains prebuilt as Python lists from
    the same dense block ids), its hit tokens and the prompt tokens."""
    inp = _input(pl.read_parquet(path))
    view = inp.blocks(B)
    ids = view.ids.tolist()
    bounds = view.offsets.tolist()
    chains = [ids[bounds[i] : bounds[i + 1]] for i in range(inp.n)]
    del ids
    args = (
        chains,
        view.prompt_blocks.tolist(),
        view.missing.tolist(),
        inp.prompt_tokens.tolist(),
        B,
        cache_tokens // B,
        [0] * inp.n,
        1,
    )
    start = time.perf_counter()
    hits = lru_reference(*args)
    return time.perf_counter() - start, sum(hits), int(inp.prompt_tokens.sum())


COMMANDS = {
    "simulate": ("simulate", "--cache-tokens"),
    "simulate instant": ("simulate", "--cache-tokens", "--request-lifetime", "instant"),
    "curve": ("curve",),
}


WORKLOADS: dict[str, tuple[str, Callable[[int], pl.DataFrame]]] = {
    "conversations": (
        "multi-turn conversations on shared system prompts, answers in the chain "
        "(perf.prefix.generate)",
        lambda n: conversation_trace(n, B),
    ),
    "prompts-only": (
        "the same model's conversations with only the prompts' blocks in the chain, answers "
        "unknown (generate above, the kernel comparison's workload)",
        lambda n: generate(n, seed=1).with_columns(pl.lit(None, pl.String).alias("session_id")),
    ),
}
ALIASES = {"synthetic": "prompts-only"}  # its name before both came from perf.workload


def process(
    n: int,
    cache_tokens: int,
    baseline: Path | None,
    *,
    workload: str = "conversations",
    repeat: int = 3,
    reference: bool = True,
) -> None:
    """``enginefit simulate`` and ``enginefit curve`` as whole processes on an ``n``-request
    trace of ``workload`` (no session ids logged), against the pure-Python LRU and (with
    ``baseline``) another checkout's code."""
    workload = ALIASES.get(workload, workload)
    what, make = WORKLOADS[workload]
    with tempfile.TemporaryDirectory(prefix="perf-sim-") as tmp:
        folder = Path(tmp)
        path = folder / "trace.parquet"
        frame = make(n)
        blocks = int(frame["prefix_hashes"].list.len().sum())
        frame.write_parquet(path)
        del frame
        print(
            f"whole process, {workload}: {n:,} requests, {what}; no session ids logged; "
            f"{blocks:,} chain blocks of {B} tokens; canonical Parquet "
            f"{path.stat().st_size / 2**20:,.0f} MiB; 1 replica, round-robin, "
            f"{cache_tokens:,} cache tokens; built-in defaults; best of {repeat}"
        )
        codes = {"ours": ROOT, **({"baseline": baseline} if baseline is not None else {})}
        best: dict[tuple[str, str], float] = {}
        outputs: dict[tuple[str, str], Any] = {}
        for name, (command, *flags) in COMMANDS.items():
            args = [command, str(path), "--block-size", str(B)]
            if "--cache-tokens" in flags:
                args += ["--cache-tokens", str(cache_tokens)]
            args += [f for f in flags if f != "--cache-tokens"]
            for code in codes.values():
                _command(code, args, folder)  # numba caches compiled, file in the page cache
            for _ in range(repeat):
                for label, code in codes.items():
                    seconds, output = _command(code, args, folder)
                    key = (name, label)
                    best[key] = min(best.get(key, float("inf")), seconds)
                    outputs[key] = output
        for label in codes:
            assert (
                outputs[("simulate", label)]["hit_tokens_instant"]
                == outputs[("simulate instant", label)]["hit_tokens"]
            ), label
        phases = _phases(path, cache_tokens)
        print(
            "  phases in process (ours): "
            + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in phases)
        )
        ref_s = None
        if reference:
            ref_s, ref_hits, prompt = _reference(path, cache_tokens)
            for label in codes:
                got = outputs[("simulate", label)]["hit_tokens_instant"]
                assert got == ref_hits, (label, got, ref_hits)
            print(
                f"  reference (perf/sim_oracles.py lru_reference, instant lifetime, same "
                f"blocks, the loop alone): {ref_s:.1f} s, hit ratio {ref_hits / prompt:.4f} "
                "(the commands' instant hit tokens equal it)"
            )
        for name in COMMANDS:
            line = f"  enginefit {name:<17}"
            for label in codes:
                line += f" {label} {best[(name, label)]:6.2f} s"
            if ref_s is not None and name.startswith("simulate"):
                line += "   reference / ours " + f"{ref_s / best[(name, 'ours')]:.1f}x"
            print(line)
        for label in codes:
            curve, one = best[("curve", label)], best[("simulate", label)]
            print(
                f"  {label}: curve / one scenario as whole commands {curve / one:.2f}x "
                f"(vs the instant-only scenario {curve / best[('simulate instant', label)]:.2f}x)"
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--cache-tokens", type=int, default=2_000_000)
    parser.add_argument("--big", type=int, default=0, help="large trace end to end; 0 skips")
    parser.add_argument(
        "--large-compare", type=int, default=1_000_000, help="reference vs ours, 1 replica; 0 skips"
    )
    parser.add_argument(
        "--process-sizes",
        default="100000,1000000",
        help="requests of each whole-process run (comma-separated; empty skips)",
    )
    parser.add_argument(
        "--process-workloads",
        default="conversations,prompts-only",
        help=f"workloads of the whole-process runs (comma-separated, of {list(WORKLOADS)})",
    )
    parser.add_argument(
        "--process-repeat", type=int, default=3, help="runs of each command (the best counts)"
    )
    parser.add_argument(
        "--process-reference-max",
        type=int,
        default=1_000_000,
        help="largest whole-process run that also times the pure-Python LRU",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=Path(os.environ["PERF_BASELINE"]) if os.environ.get("PERF_BASELINE") else None,
        help="another checkout whose commands are timed beside ours (default: $PERF_BASELINE)",
    )
    args = parser.parse_args(argv if argv is not None else [])
    for workload in [w.strip() for w in args.process_workloads.split(",") if w.strip()]:
        for size in [int(v) for v in args.process_sizes.split(",") if v.strip()]:
            process(
                size,
                16_000_000,
                args.baseline,
                workload=workload,
                repeat=args.process_repeat,
                reference=size <= args.process_reference_max,
            )
    compare(args.requests, args.cache_tokens)
    if args.large_compare:
        compare(args.large_compare, 16_000_000, routings=((1, "round-robin"),), extras=False)
    if args.big:
        big(args.big, 16_000_000)


if __name__ == "__main__":
    main(sys.argv[1:])
