"""``make validate``: the capacity model checked against a real engine, llama.cpp's llama-server.

What it does, in one run on one machine (so every figure sees the same machine):

1. **The server.** llama.cpp's C++ ``llama-server`` (continuous batching over ``-np`` slots),
   built once per machine from the source the ``engine`` extra pins (``perf/llama_server.py``),
   serving a random-weight LLaMA written with gguf-py (:data:`MODEL`, ``tests/tiny_gguf.py``)
   whose vocabulary holds every prompt word the load test writes (a planned prompt of N words
   is N tokens + BOS). Flags :data:`FLAGS`, compute pinned to one thread (``-t 1``); the
   server and this process run at the highest priority the machine allows (real-time
   ``SCHED_FIFO`` where permitted, else ``nice``; :func:`raise_priority`), so other work on a
   shared machine delays them less.
2. **Three request mixes** (:data:`MIXES`): short prompts, prompts ≥ 4× longer, and long prompts
   that share a few system prompts (the server's slots reuse a matching prefix). Each is a
   canonical trace whose arrivals are one unit-rate Poisson draw, the same for every mix;
   ``enginefit loadtest --arrivals trace`` replays it open loop scaled to each rate (common
   random numbers: two probes differ in their rate, not in their luck).
3. **Measured capacity** per mix: the largest rate whose load point the bench stage passes at
   :data:`SLO` (p95 TTFT, p99 ITL, kept up, errors), found by a sweep then a rate bisection on
   the real server (:class:`Bisection`), the mixes' probes interleaved; the capacity is
   interpolated between the last pass and the first failure on the SLO margin. The
   loadtest's manifest gets an ``engine_args`` record of the server's flags.
4. **Predicted capacity**: ``enginefit bench``'s reading and analysis of one mix's loadtest
   folders, then the capacity stage (``pipeline.capacity.stage.run``: its limits from the
   manifests' ``engine_args`` by its own precedence, the model's shape as a team gives it in
   ``requirements.kv_cache``), carried to the other mix with what the stage's readers would
   give it for that mix's trace: its own arrivals (the shape stage's reading) and, for shared
   prefixes, the fleet's own cache (the simulate stage's scenarios and replay): short → long,
   long → short, and both → the shared-prefix mix. The figure judged is the fitted serving
   model's capacity there (``model``); what the stage carries (``enginefit carries``: the same
   number, or nothing when its self-check withholds it) is shown beside it. The fit and the
   measurement of the other mix share nothing but the server and the machine.
5. **Verdict**: signed error = predicted ÷ measured − 1 per direction. Pass when every one is
   within :data:`BOUND`. Machine noise is measured, not assumed away: a reference request
   timed by the server itself (its ``timings``) before, between and after the phases gives the
   server's speed; when it moved more than :data:`NOISE_LIMIT`, a run whose errors exceed the
   bound is reported **not judged** (exit 3) instead of failed. A run that could not measure
   (no server, no passing or failing rate, no prediction) fails (exit 1).

Run from the repository root: ``.venv/bin/python -m perf.validate [--out DIR] [--quick]``.
Prints the table and writes ``validate.json`` (and every loadtest folder) under ``--out``;
``--refit DIR`` fits and predicts again on a kept run's loadtests (nothing is measured).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import numpy as np
import polars as pl
import yaml

from pipeline.bench import stage as bench_stage
from pipeline.bench.config import BenchConfig, parse_slo_spec
from pipeline.bench.manifest import DIR_MANIFEST_NAME
from pipeline.capacity import stage as capacity_stage
from pipeline.capacity.compute import (
    carry_to_workload,
    unidentified_context,
    workload_requests,
)
from pipeline.capacity.config import CapacityConfig, ServedModel
from pipeline.capacity.fleet_cache import CacheReplays
from pipeline.capacity.prior import ModelShape
from pipeline.capacity.result import CandidateCapacity, ServingModel, Slo
from pipeline.capacity.search import sample_requests
from pipeline.cli import main as enginefit
from pipeline.config import default_config
from pipeline.costing import Prices
from pipeline.loadtest.plan import WORDS
from pipeline.schema import conform
from pipeline.settings import with_flags
from pipeline.shape.compute import compute_shape
from pipeline.sim.blocks import sim_input
from pipeline.sim.compute import scenario_summary
from pipeline.store import write_bytes_atomic
from pipeline.unknown import Unknown
from tests.llama_cpp_server import LlamaServer, LlamaServerFlags, run_llama_server
from tests.tiny_gguf import LlamaShape, write_tiny_llama_gguf

# ----------------------------------------------------------------------------- what is run

#: The served model (random weights; docs/capacity.md, "Checked against a real engine"). Sized
#: so the CPU's costs fall as a GPU's do: a prompt token costs ~1 % of a decode step (the
#: 65,536-entry output projection is read once a step, whatever the batch, like a GPU's
#: weights); one 16-wide attention head keeps attention a few % of prefill at these lengths.
MODEL = LlamaShape(
    n_embd=64, n_layer=2, n_head=1, n_head_kv=1, n_head_dim=16, n_ff=512, n_ctx=4096, n_vocab=65536
)
MODEL_NAME = "enginefit-validate"
#: The deployment under test: llama-server's own step sizes (-b 2048 -ub 512) and its default of
#: 4 slots, each with a 2,048-token context; one compute thread.
FLAGS = LlamaServerFlags(slots=4, ctx_size=4 * 2048, batch_size=2048, ubatch_size=512, threads=1)
#: p95 TTFT about 10× a lone long prompt's; p99 ITL about twice the step that prefills one, so
#: TTFT binds, as in a chat SLO (at 250 ms the long mix's p95 TTFT sat on a plateau near the
#: limit over a 1.5× range of rates, which made its capacity a coin toss).
SLO = Slo(ttft_p95_ms=500.0, itl_p99_ms=150.0)
#: The largest |signed error| a direction may have for the check to pass. On the shared 2-core
#: machine (load average 2–16) the worst direction of a run was 16–19 % with the server's own
#: speed steady and 26–29 % where it moved (docs/capacity.md): a tighter bound would fail
#: there by chance.
BOUND = 0.40
#: What the model aims for (the error the best published serving simulators report): each
#: direction is said to be within it or not; the check does not fail on it.
AIM = 0.15
#: The server's speed (its own timing of the reference request) may move this much during a
#: run before an out-of-bound result is put down to the machine rather than the model.
NOISE_LIMIT = 0.15
BLOCK = 16


@dataclass(frozen=True)
class Mix:
    """One request mix: prompt and output lengths drawn uniformly from the ranges (inclusive),
    the first ``prefix_tokens`` of every prompt shared with the other requests of its group
    (one of ``prefix_groups`` system prompts; 0: every prompt its own)."""

    name: str
    prompt: tuple[int, int]
    output: tuple[int, int]
    prefix_groups: int = 0
    prefix_tokens: int = 0

    def trace(self, seed: int, arrivals_s: np.ndarray) -> pl.DataFrame:
        """The mix as a canonical trace, one request per arrival (seconds from the start; the
        load test scales the pattern to each rate)."""
        requests = int(arrivals_s.size)
        rng = np.random.default_rng(seed)
        prompts = rng.integers(self.prompt[0], self.prompt[1] + 1, requests)
        outputs = rng.integers(self.output[0], self.output[1] + 1, requests)
        blocks = self.prefix_tokens // BLOCK
        groups = rng.integers(0, max(self.prefix_groups, 1), requests)
        # Block hashes of the shared prefix only: the load test writes the same words for the
        # same hash, and words of the send's own for the rest of the prompt.
        hashes = [
            [int(g) * 1000 + k + 1 for k in range(blocks)] if self.prefix_groups else []
            for g in groups
        ]
        t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        return conform(
            pl.DataFrame(
                {
                    "request_id": [f"{self.name}-{i}" for i in range(requests)],
                    "arrival": [t0 + dt.timedelta(seconds=float(a)) for a in arrivals_s],
                    "prompt_tokens": prompts,
                    "output_tokens": outputs,
                    "block_size": [BLOCK] * requests,
                    "prefix_hashes": hashes,
                    "prompt_blocks": [len(h) for h in hashes],
                    "hashes_known": [bool(self.prefix_groups)] * requests,
                },
                schema_overrides={"prefix_hashes": pl.List(pl.UInt64)},
            )
        )

    def cached_share(self, trace: pl.DataFrame) -> float:
        """Share of prompt tokens a prefix cache serves when it holds every shared prefix
        after its first use (one miss per group)."""
        if not self.prefix_groups:
            return 0.0
        prompt = trace.get_column("prompt_tokens").to_numpy()
        cached = np.minimum(self.prefix_tokens, prompt - 1)
        return float((cached.sum() - self.prefix_groups * self.prefix_tokens) / prompt.sum())

    def describe(self) -> str:
        text = (
            f"prompts {self.prompt[0]}–{self.prompt[1]}, answers {self.output[0]}–{self.output[1]}"
        )
        if self.prefix_groups:
            text += f", {self.prefix_groups} shared {self.prefix_tokens}-token prefixes"
        return text


#: Prompt lengths spread widely within each mix, so TTFT against prompt length (the fit's
#: prefill cost) is not lost in the noise; the long mix's mean prompt is 4.9× the short one's.
MIXES = (
    Mix("short", prompt=(16, 400), output=(24, 40)),
    Mix("long", prompt=(512, 1536), output=(24, 40)),
    Mix("prefix", prompt=(896, 1152), output=(24, 40), prefix_groups=2, prefix_tokens=768),
)
#: fit on → predict: both directions between the lengths, both onto the shared prefixes, and
#: both lengths together onto them (two mixes tell the context's cost from a request's).
DIRECTIONS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("short",), "long"),
    (("long",), "short"),
    (("short",), "prefix"),
    (("long",), "prefix"),
    (("short", "long"), "prefix"),
)
#: Requests of each mix's trace: the capacity search's own sample size (``capacity.
#: sample_requests``), so the prediction is the stage's steady-state figure. A probe replays
#: the pattern's first few hundred. (The search on this mix's 250 requests gave 6.4–11.5 req/s
#: over four seeds; on 4,000, 15.1–17.1 over six: near the capacity p95 TTFT is made by a few
#: bursts, and a short sample has too few of them.)
TRACE_REQUESTS = default_config().capacity.sample_requests


def poisson_arrivals(requests: int, seed: int) -> np.ndarray:
    """Arrival times (s) of a unit-rate Poisson process, rounded to the microsecond a trace
    keeps. Every mix replays this one pattern scaled to each probed rate (``--arrivals
    trace``): the probes of a bisection then differ in their rate alone, not in their draw of
    bursts, so a higher rate is never the luckier one (common random numbers)."""
    gaps = np.random.default_rng([seed, 0xA77]).exponential(1.0, requests)
    return np.round(np.cumsum(gaps), 6)


@dataclass(frozen=True)
class Timing:
    """How long each load point runs: ``warmup_s`` discarded, then at least ``duration_s`` and
    enough time for ``min_requests`` measured requests (up to ``max_duration_s``)."""

    duration_s: float = 15.0
    warmup_s: float = 3.0
    # The bench stage judges p99 ITL on ≥ 100 completed requests; a Poisson count has margin.
    min_requests: int = 130
    max_duration_s: float = 40.0
    #: The fitted mixes' sweep, × the first guess of the capacity: a light point (where TTFT
    #: against prompt length shows the prefill cost, queueing aside), two loaded ones and one
    #: past it, as a benchmark sweep has.
    sweep: tuple[float, ...] = (0.15, 0.4, 0.7, 0.95)
    #: The sweep of a mix only measured (its capacity is predicted, never fitted on).
    measured_sweep: tuple[float, ...] = (0.7, 1.0)
    bisection_rounds: int = 4
    ratio: float = 1.08  # the bisection stops when the bracket is this narrow

    def seconds(self, rate: float) -> float:
        return min(max(self.duration_s, self.min_requests / rate), self.max_duration_s)


#: Rounds a mix may add after the planned ones while it has no passing or no failing rate.
EXTRA_ROUNDS = 3
#: The first guess of a mix's capacity: this share of the rate its slots serve requests back
#: to back, each alone (on this server the capacity came out at 0.3-0.55 of it).
GUESS_SHARE = 0.45
#: Without a failing (passing) rate yet, the next probe is this factor above (below) the
#: highest pass (lowest failure).
STEP = 1.35
QUICK = Timing(
    duration_s=8.0,
    warmup_s=2.0,
    max_duration_s=25.0,
    sweep=(0.2, 0.6, 1.0),
    measured_sweep=(0.7, 1.0),
    bisection_rounds=1,
)

# ---------------------------------------------------------------------------- the bisection


Outcome = Literal["pass", "fail", "inconclusive"]


def probe_outcome(status: str, margin: float, kept_up: str) -> Outcome:
    """The bench stage's SLO status as a bisection step: an ``unknown`` point whose latency
    limits are already broken, or whose queue grew, failed; one that could not be judged
    otherwise (too few requests) is inconclusive and moves nothing."""
    if status in ("pass", "fail"):
        return "pass" if status == "pass" else "fail"
    if kept_up == "overloaded" or (math.isfinite(margin) and margin > 1.0):
        return "fail"
    return "inconclusive"


@dataclass(frozen=True)
class ProbeResult:
    """One load point as the bench stage judged it."""

    rate_rps: float
    outcome: Outcome
    margin: float  # max(p95 TTFT ÷ limit, p99 ITL ÷ limit): ≥ 1 breaks the SLO; NaN unknown
    status: str  # the bench stage's slo_status
    reason: str
    ttft_p95_ms: float | None
    itl_p99_ms: float | None
    kept_up: str
    completed: int
    folder: str
    #: The machine's 1-minute load average when the point ended (NaN: not read).
    load_average: float = math.nan


@dataclass
class Bisection:
    """The measured capacity of one mix: probes' verdicts in, the next rate to try out.

    Noise can make a probe pass above one that failed; the bracket is then the highest pass
    below the lowest failure (a pass above a failure counts as an inversion, reported)."""

    ratio: float
    probes: list[ProbeResult] = field(default_factory=list)

    def add(self, probe: ProbeResult) -> None:
        self.probes.append(probe)

    def lowest_fail(self) -> ProbeResult | None:
        fails = [p for p in self.probes if p.outcome == "fail"]
        return min(fails, key=lambda p: p.rate_rps) if fails else None

    def highest_pass(self) -> ProbeResult | None:
        fail = self.lowest_fail()
        passes = [
            p
            for p in self.probes
            if p.outcome == "pass" and (fail is None or p.rate_rps < fail.rate_rps)
        ]
        return max(passes, key=lambda p: p.rate_rps) if passes else None

    def inversions(self) -> int:
        fail = self.lowest_fail()
        return sum(
            1 for p in self.probes if p.outcome == "pass" and fail and p.rate_rps >= fail.rate_rps
        )

    def next_rate(self) -> float | None:
        """The next rate to probe (None: the bracket is narrow enough)."""
        low, high = self.highest_pass(), self.lowest_fail()
        if low is None and high is None:
            raise ValueError("no probe passed or failed yet: start with a sweep")
        if high is None:
            assert low is not None
            return low.rate_rps * STEP
        if low is None:
            return high.rate_rps / STEP
        if high.rate_rps / low.rate_rps <= self.ratio:
            return None
        return math.sqrt(low.rate_rps * high.rate_rps)

    def capacity(self) -> tuple[float, float, float] | str:
        """(estimate, last pass, first failure) in req/s, or why there is none. The estimate
        interpolates log(margin) linearly in log(rate) to where the margin is 1; when a side's
        margin is unknown or on the wrong side of 1 (a failure for another reason than the
        latency limits, e.g. the queue grew), the bracket's geometric middle."""
        low, high = self.highest_pass(), self.lowest_fail()
        if low is None:
            return "no probed rate passed the SLO"
        if high is None:
            return f"no probed rate failed the SLO (highest tried {low.rate_rps:.3g} req/s)"
        lo, hi = math.log(low.rate_rps), math.log(high.rate_rps)
        m_lo, m_hi = low.margin, high.margin
        if math.isfinite(m_lo) and math.isfinite(m_hi) and 0 < m_lo < 1 < m_hi:
            share = -math.log(m_lo) / (math.log(m_hi) - math.log(m_lo))
            estimate = math.exp(lo + share * (hi - lo))
        else:
            estimate = math.exp((lo + hi) / 2)
        return estimate, low.rate_rps, high.rate_rps


def with_load(probe: ProbeResult) -> ProbeResult:
    """The probe with the machine's load average now, just after it ran."""
    return dataclasses.replace(probe, load_average=round(os.getloadavg()[0], 2))


def signed_error(predicted: float, measured: float) -> float:
    return predicted / measured - 1.0


@dataclass(frozen=True)
class Verdict:
    code: int  # 0 pass, 1 fail, 3 not judged (the machine was too noisy)
    text: str


def verdict(
    errors: dict[str, float | str],
    bound: float,
    speed_change: float | None,
    noise_limit: float,
    aim: float = AIM,
    withheld: dict[str, str] | None = None,
) -> Verdict:
    """Pass when every judged direction has an error within the bound; otherwise fail on a
    quiet machine and not judged on a noisy one. A direction without a number (a capacity that
    was not measured or not predicted) is a failure: a check that did not measure never passes.
    How many are within ``aim`` is said either way. ``withheld``: directions the stage carries
    nothing to because its model cannot price the target's context (each with what the model
    would have been off by): said, not judged; they do not make a check pass on their own."""
    missing = {k: v for k, v in errors.items() if isinstance(v, str)}
    numbers = {k: v for k, v in errors.items() if not isinstance(v, str)}
    outside = {k: v for k, v in numbers.items() if abs(v) > bound}
    noisy = speed_change is None or speed_change > noise_limit
    gauge = (
        "the server's speed was not gauged"
        if speed_change is None
        else f"the server's own timing of the reference request moved {speed_change:.0%} "
        f"during the run (limit {noise_limit:.0%})"
    )
    if not errors:
        return Verdict(1, "FAIL: nothing was measured")
    aimed = sum(1 for v in numbers.values() if abs(v) <= aim)
    gauge += f"; {aimed} of {len(errors)} within the ±{aim:.0%} aim"
    if withheld:
        gauge += "; withheld by enginefit (one mix cannot price their context): " + ", ".join(
            f"{k} ({v})" for k, v in withheld.items()
        )
    if not missing and not outside:
        worst = max(abs(v) for v in numbers.values())
        return Verdict(
            0, f"PASS: every signed error within ±{bound:.0%} (worst {worst:.1%}); {gauge}"
        )
    problems = [f"{k}: {v}" for k, v in missing.items()]
    problems += [f"{k} {v:+.1%}" for k, v in outside.items()]
    if noisy and not missing:
        return Verdict(
            3,
            f"NOT JUDGED: {'; '.join(problems)} outside ±{bound:.0%}, but {gauge}: the machine "
            "was too noisy to tell the model from the machine",
        )
    what = "FAIL (machine noisy)" if noisy else "FAIL"
    return Verdict(1, f"{what}: {'; '.join(problems)} (bound ±{bound:.0%}); {gauge}")


# ------------------------------------------------------------------------- the machine


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (Linux /proc), 0 when unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _busy_seconds() -> float:
    """CPU seconds every process on the machine has used since boot (all cores)."""
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return math.nan
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@dataclass
class MachineGauge:
    """How busy the rest of the machine was: CPU the other processes used while we ran."""

    server_pid: int
    start_wall: float = field(default_factory=time.monotonic)
    start_busy: float = field(default_factory=_busy_seconds)
    start_own: float = 0.0

    def __post_init__(self) -> None:
        self.start_own = self._own()

    def _own(self) -> float:
        usage = os.times()
        return usage.user + usage.system + _cpu_seconds(self.server_pid)

    def others_cores(self) -> float:
        """Mean cores the other processes kept busy since the gauge started."""
        wall = time.monotonic() - self.start_wall
        busy = _busy_seconds() - self.start_busy
        own = self._own() - self.start_own
        return max(busy - own, 0.0) / wall if wall > 0 else math.nan


#: Real-time priority (SCHED_FIFO) of the run and the server it starts, where permitted: on a
#: busy machine a normal or even niced process waits behind others at every wake-up, which
#: moved this server's step times 2-5× between runs; under SCHED_FIFO they repeat within a few
#: %. The kernel keeps 5 % of each second for the rest (sched_rt_runtime_us), the server uses
#: one core, and the run lasts minutes.
FIFO_PRIORITY = 10


def raise_priority() -> str:
    """The highest priority this process may take (inherited by the server it starts)."""
    with contextlib.suppress(PermissionError, OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(FIFO_PRIORITY))
        return f"real-time (SCHED_FIFO {FIFO_PRIORITY})"
    for nice in (-20, -10, -5):
        try:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        except (PermissionError, OSError):
            continue
        return f"nice {nice} (real-time priority was not permitted)"
    return f"nice {os.getpriority(os.PRIO_PROCESS, 0)} (raising the priority was not permitted)"


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = None
    with contextlib.suppress(OSError, ValueError):
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(memory, 1) if memory else None,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


# --------------------------------------------------------------------------- the server


REFERENCE_PROMPT_WORDS = 256
REFERENCE_OUTPUT = 64


def lone_request_ms(server: LlamaServer, words: np.ndarray, output: int) -> float:
    """The server's own time (ms, from its ``timings``: prefill + decode) for one request of
    these words (indices into :data:`WORDS`) and ``output`` tokens, its cache unused."""
    body = {
        "model": server.model,
        "prompt": " ".join(WORDS[i] for i in words),
        "max_tokens": output,
        "ignore_eos": True,
        "cache_prompt": False,
    }
    with httpx.Client(timeout=60.0) as client:
        timings = client.post(f"{server.url}/completions", json=body).json()["timings"]
    return float(timings["prompt_ms"]) + float(timings["predicted_ms"])


def reference_speed(server: LlamaServer, seed: int) -> float:
    """The server's own time (ms) for one lone reference request (prefill + decode, from its
    ``timings``), median of three: what the machine lets the server do right now."""
    rng = np.random.default_rng(seed)
    times = [
        lone_request_ms(
            server, rng.integers(0, len(WORDS), REFERENCE_PROMPT_WORDS), REFERENCE_OUTPUT
        )
        for _ in range(3)
    ]
    return float(np.median(times))


@dataclass
class Lab:
    """A running server and the folder its load tests write into."""

    server: LlamaServer
    out: Path
    traces: dict[str, Path]
    timing: Timing
    log: Path
    seed: int = 0
    runs: int = 0

    def loadtest(self, mix: str, rates: Sequence[float]) -> list[Path]:
        """``enginefit loadtest`` of one mix at ``rates`` (one folder per rate, so each is one
        load point), with the server's flags recorded in each folder's manifest."""
        folders = []
        for rate in rates:
            self.runs += 1
            folder = self.out / "loadtests" / f"{self.runs:02d}-{mix}-{rate:.4g}rps"
            argv = [
                "loadtest", str(self.traces[mix]), "--config", str(self.out / "enginefit.yaml"),
                "--endpoint", self.server.url, "--model", self.server.model,
                "--rates", f"{rate:.6g}", "--duration", f"{self.timing.seconds(rate):.3g}s",
                "--warmup", f"{self.timing.warmup_s:g}s", "--arrivals", "trace",
                "--length-control", "ignore_eos", "--seed", str(self.seed + self.runs),
                "--engine", "llama.cpp", "--gpu-type", "cpu", "--gpu-count", "1",
                "--price", "0.05", "--out", str(folder),
            ]  # fmt: skip
            with (
                self.log.open("a") as log,
                contextlib.redirect_stdout(log),
                contextlib.redirect_stderr(log),
            ):
                print(f"\n$ enginefit {' '.join(argv)}", flush=True)
                code = enginefit(argv)
            if code != 0:
                raise RuntimeError(f"enginefit loadtest exited with {code}; see {self.log}")
            record_engine_args(folder, self.server)
            folders.append(folder)
        return folders


def write_config(out: Path, traces: dict[str, Path]) -> Path:
    """The loadtests' configuration: the defaults (a configuration names a workload; the
    loadtests replay the traces they are given, never this one)."""
    path = out / "enginefit.yaml"
    workload = {"name": "validate", "traces": [p.name for p in traces.values()]}
    path.write_text(yaml.safe_dump({"workload": workload}), encoding="utf-8")
    return path


def record_engine_args(folder: Path, server: LlamaServer) -> None:
    """Add the server's flags to the loadtest's manifest as ``engine_args`` (the harness
    launched the server, so it knows them; a loadtest of someone else's server cannot)."""
    path = folder / DIR_MANIFEST_NAME
    manifest = yaml.safe_load(path.read_text(encoding="utf-8"))
    manifest["engine_args"] = dict(server.engine_args)
    header = (
        "# Written by enginefit loadtest from its flags; engine_args by perf/validate.py, which\n"
        f"# started the server: {' '.join(server.command)}\n"
    )
    write_bytes_atomic(path, (header + yaml.safe_dump(manifest, sort_keys=True)).encode())


def engine_limits(folders: Sequence[Path]) -> dict[str, Any]:
    """The deployment's limits from the loadtests' own manifests (one deployment: all agree)."""
    found = set()
    for folder in folders:
        manifest = yaml.safe_load((folder / DIR_MANIFEST_NAME).read_text(encoding="utf-8"))
        args = manifest.get("engine_args")
        if not isinstance(args, dict):
            raise RuntimeError(f"{folder / DIR_MANIFEST_NAME}: no engine_args")
        found.add(json.dumps(args, sort_keys=True))
    if len(found) != 1:
        raise RuntimeError(f"the loadtests of one deployment record different engine_args: {found}")
    limits: dict[str, Any] = json.loads(found.pop())
    return limits


# ----------------------------------------------------------------------- bench and capacity


def bench_settings() -> BenchConfig:
    base = default_config().bench
    spec = parse_slo_spec(
        f"ttft_p95_ms={SLO.ttft_p95_ms:g},itl_p99_ms={SLO.itl_p99_ms:g}", base.slo
    )
    return with_flags(base, {"slo": ("--slo", spec)})


def judge(folders: Sequence[Path], settings: BenchConfig) -> list[ProbeResult]:
    """The bench stage's verdict on each folder's load point (what `enginefit bench` prints)."""
    results = bench_stage.read_results(settings, list(folders))
    analysis = bench_stage.run(bench_stage.BenchInputs(results, None, "none", None), settings)
    rows = analysis.evaluated.to_dicts()
    out = []
    for folder in folders:
        mine = [r for r in rows if Path(str(r["source_file"])).parent == folder]
        if len(mine) != 1:
            raise RuntimeError(
                f"{folder}: expected one load point, the bench stage read {len(mine)}"
            )
        row = mine[0]
        ttft, itl = row.get("ttft_p95_ms"), row.get("itl_p99_ms")
        margins = [
            value / limit
            for value, limit in ((ttft, SLO.ttft_p95_ms), (itl, SLO.itl_p99_ms))
            if value is not None
        ]
        rate = row.get("offered_rate_rps") or float(folder.name.split("-")[-1].removesuffix("rps"))
        margin = max(margins) if len(margins) == 2 else math.nan
        out.append(
            ProbeResult(
                rate_rps=float(rate),
                outcome=probe_outcome(
                    str(row["slo_status"]), margin, str(row.get("keep_up_status"))
                ),
                margin=margin,
                status=str(row["slo_status"]),
                reason=str(row.get("slo_reason") or ""),
                ttft_p95_ms=ttft,
                itl_p99_ms=itl,
                kept_up=str(row.get("keep_up_status")),
                completed=int(row.get("completed") or 0),
                folder=str(folder),
            )
        )
    return out


@dataclass(frozen=True)
class Prediction:
    """What the capacity stage says of the target mix (``capacity_rps``: the number it carries,
    or why not) and what its fitted serving model gives there whatever the self-check said
    (``model_rps``: the model's own transfer error, which the check bounds)."""

    capacity_rps: float | Unknown
    model_rps: float | Unknown
    candidate: CandidateCapacity
    #: Why the stage carries nothing because its model cannot price the target's context
    #: (None: it can): such a direction is not judged on ``model_rps``.
    unidentified: str | None = None


def served_model_shape() -> ModelShape:
    """:data:`MODEL` as ``requirements.kv_cache`` would describe it (a team that knows its
    model's shape gives it): F16 weights and llama-server's default F16 KV cache."""
    embeddings = 2 * MODEL.n_vocab * MODEL.n_embd  # token embedding and output projection
    return ModelShape(
        params_billion=(MODEL.parameters() + embeddings) / 1e9,
        weight_bytes=2.0,
        layers=MODEL.n_layer,
        kv_heads=MODEL.n_head_kv,
        head_dim=MODEL.head_dim,
        kv_bytes=2.0,
        attention_heads=MODEL.n_head,
        source="perf/validate.py MODEL",
    )


def predict(
    folders: Sequence[Path], target: Mix, trace: pl.DataFrame, settings: BenchConfig
) -> Prediction:
    """The capacity stage's capacity of the deployment benchmarked in ``folders`` on the
    ``target`` mix: the bench stage reads and analyses the folders (as ``enginefit bench``
    does), the capacity stage fits its serving model on their kept-up points and searches the
    target's capacity at the SLO with the target's own arrivals (the shape stage's reading of
    the trace) and, for shared prefixes, the fleet's own cache (the simulate stage's replay of
    the trace), the limits its own precedence reads from the loadtests' manifests
    (``engine_args``: slots, batch, context), and the model's shape as a team gives it."""
    results = bench_stage.read_results(settings, list(folders))
    analysis = bench_stage.run(bench_stage.BenchInputs(results, None, "none", None), settings)
    limits = engine_limits(folders)
    base = default_config()
    config: CapacityConfig = base.capacity
    slo = capacity_stage.capacity_slo(settings.slo)
    kv_tokens = int(limits["kv_cache_tokens"])
    inputs = capacity_stage.CapacityInputs(
        workload=target.name,
        points=analysis.evaluated,
        per_request=results.per_request,
        bench_capacity=analysis.capacity,
        requests=workload_requests(trace),
        table_rows=trace.height,
        peak_rate_rps=1.0,  # one replica: the server measured
        mean_rate_rps=None,
        kv_tokens=kv_tokens,
        measured_arrivals=compute_shape(trace, base.shape).metrics.arrivals,
        cache=fleet_cache(target, trace),
        served=ServedModel(models=(MODEL_NAME,), kv_tokens=kv_tokens, shape=served_model_shape()),
        model_shape=served_model_shape(),
        team_models=(MODEL_NAME,),
        prices=Prices(default=0.05),
        slo=slo,
        min_achieved_rate_share=settings.slo.min_achieved_rate_share,
        catalog=base.catalog(),
    )
    result = capacity_stage.run(inputs, config)
    if len(result.candidates) != 1:
        raise RuntimeError(
            f"expected one deployment, the capacity stage found {len(result.candidates)}"
        )
    candidate = result.candidates[0]
    model_rps, unidentified = unchecked_capacity(inputs, config, candidate)
    return Prediction(candidate.workload_capacity_rps, model_rps, candidate, unidentified)


def fleet_cache(mix: Mix, trace: pl.DataFrame) -> CacheReplays | Unknown:
    """What the capacity stage replays the fleet's prefix cache from, as ``enginefit simulate``
    would give it: the trace flattened for replay and the simulation's default scenarios."""
    if not mix.prefix_groups:
        return Unknown(reason="the mix shares no prefixes")
    base = default_config()
    replay = base.cache_replay()
    flattened = sim_input(trace, latency_model=replay.latency)
    summaries = [
        scenario_summary(flattened, s, replay.simulation) for s in replay.simulation.scenarios()
    ]
    return CacheReplays(flattened, replay.simulation, summaries)


def unchecked_capacity(
    inputs: capacity_stage.CapacityInputs, config: CapacityConfig, candidate: CandidateCapacity
) -> tuple[float | Unknown, str | None]:
    """The fitted model's capacity on the target mix whatever its self-check said and whether
    or not it can price the target's context: the number the stage carried, else the stage's
    own carrying of the same model with the check marked passed and its context trusted (the
    same sample, arrivals, cache and KV pool as the stage's): how far the model's form is from
    the engine. Second: why the stage withheld it for the context (None: it did not)."""
    model = candidate.serving_model
    if isinstance(model, Unknown) or not isinstance(candidate.workload_capacity_rps, Unknown):
        return candidate.workload_capacity_rps, None
    passed = model.self_check.model_copy(update={"passed": True, "reason": None})
    workload = inputs.requests
    pattern = capacity_stage.arrival_pattern(inputs.measured_arrivals, config, inputs.table_rows)
    sample = sample_requests(
        workload.prompt, workload.output, workload.cached, config, pattern, workload.arrival_s
    )
    unidentified = unidentified_context(model, sample)
    # Only the withholding reads the context's basis; the coefficients stay the fit's.
    trusted = "prior" if unidentified else model.context_basis
    again = carry_to_workload(
        candidate.candidate,
        model.model_copy(update={"self_check": passed, "context_basis": trusted}),
        workload,
        inputs.slo,
        kv_tokens=inputs.kv_tokens,
        kv_source="the loadtests' manifests",
        arrivals=capacity_stage.as_replayed(pattern, sample),
        fleet_cache=inputs.cache if isinstance(inputs.cache, CacheReplays) else None,
        gpu_hour_usd=0.05,
        peak_rate_rps=inputs.peak_rate_rps,
        mean_rate_rps=inputs.mean_rate_rps,
        config=config,
        deployment_gpus=1,
        sample=sample,
    )
    return again.workload_capacity_rps, unidentified


def model_summary(candidate: CandidateCapacity) -> dict[str, Any]:
    model = candidate.serving_model
    if isinstance(model, Unknown):
        return {"unknown": model.reason}
    assert isinstance(model, ServingModel)
    c = model.coefficients
    worst: dict[str, float] = {}
    for point in model.point_errors:
        for stat, error in point.error.items():
            if isinstance(error, float) and abs(error) > abs(worst.get(stat, 0.0)):
                worst[stat] = error
    return {
        "overhead_ms": c.overhead_s * 1e3,
        "prefill_us_per_token": c.prefill_s_per_token * 1e6,
        "attention_ns_per_pair": c.attention_s_per_pair * 1e9,
        "decode_ms_per_request": c.decode_s_per_request * 1e3,
        "context_us_per_token": c.context_s_per_token * 1e6,
        "request_latency_ms": c.request_latency_s * 1e3,
        "prefill_split_basis": model.prefill_split_basis,
        "context_basis": model.context_basis,
        "attention_basis": model.attention_basis,
        "points_used": model.points_used,
        "residual_spread": model.residual_spread,
        "worst_point_error": worst,
        "notes": model.notes,
        "provisional_reason": candidate.provisional_reason,
        "self_check_passed": model.self_check.passed,
        "self_check": model.self_check.reason or model.self_check.worst,
    }


# ------------------------------------------------------------------------------- the run


def lone_rate(mix: Mix, flags: LlamaServerFlags, server: LlamaServer, seed: int) -> float:
    """The rate the slots serve the mix back to back with no queue (a scale for the sweep):
    slots ÷ the server's own time for one mean request of the mix, alone."""
    rng = np.random.default_rng(seed)
    prompt = (mix.prompt[0] + mix.prompt[1]) // 2
    output = (mix.output[0] + mix.output[1]) // 2
    seconds = lone_request_ms(server, rng.integers(0, len(WORDS), prompt), output) / 1000.0
    return flags.slots / seconds


def sweep_order(scale: dict[str, float], timing: Timing) -> list[tuple[str, float]]:
    """The sweeps' (mix, rate) probes, one rate of each mix in turn, lightest first: the fitted
    mixes at ``timing.sweep``, a mix only measured at ``timing.measured_sweep``, × its first
    guess of the capacity (:data:`GUESS_SHARE` × the slots' back-to-back rate)."""
    fitted = {name for fit, _ in DIRECTIONS for name in fit}
    plans = {
        mix.name: [
            scale[mix.name] * GUESS_SHARE * share
            for share in (timing.sweep if mix.name in fitted else timing.measured_sweep)
        ]
        for mix in MIXES
    }
    depth = max(len(rates) for rates in plans.values())
    return [
        (name, rates[i]) for i in range(depth) for name, rates in plans.items() if i < len(rates)
    ]


@contextlib.contextmanager
def _phase(name: str, log: list[dict[str, Any]]) -> Iterator[None]:
    started = time.monotonic()
    print(f"  {name} …", file=sys.stderr, flush=True)
    yield
    log.append({"phase": name, "seconds": round(time.monotonic() - started, 1)})


def run(out: Path, timing: Timing, *, seed: int = 0) -> tuple[dict[str, Any], Verdict]:
    started = time.monotonic()
    priority = raise_priority()
    out.mkdir(parents=True, exist_ok=True)
    log = out / "loadtests.log"
    model_path = write_tiny_llama_gguf(out / f"{MODEL_NAME}.gguf", shape=MODEL, words=WORDS)
    traces: dict[str, pl.DataFrame] = {}
    trace_paths: dict[str, Path] = {}
    arrivals = poisson_arrivals(TRACE_REQUESTS, seed)
    for i, mix in enumerate(MIXES):
        traces[mix.name] = mix.trace(seed + i, arrivals)
        trace_paths[mix.name] = out / f"trace-{mix.name}.parquet"
        traces[mix.name].write_parquet(trace_paths[mix.name])
    write_config(out, trace_paths)
    settings = bench_settings()
    record: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "priority": priority,
        "model": {
            "shape": MODEL.__dict__,
            "parameters": MODEL.parameters(),
            "file": model_path.name,
        },
        "slo": SLO.model_dump(),
        "bound": BOUND,
        "aim": AIM,
        "noise_limit": NOISE_LIMIT,
        "timing": timing.__dict__,
        "mixes": {},
        "directions": {},
    }
    phases: list[dict[str, Any]] = []
    speeds: list[float] = []
    with run_llama_server(model_path, FLAGS, log_path=out / "llama-server.log") as server:
        record["server"] = {"command": list(server.command), "engine_args": server.engine_args}
        gauge = MachineGauge(server.pid)
        lab = Lab(server, out, trace_paths, timing, log, seed)
        with _phase("reference and lone-request rates", phases):
            speeds.append(reference_speed(server, seed))
            scale = {m.name: lone_rate(m, FLAGS, server, seed) for m in MIXES}
        bisections = {m.name: Bisection(timing.ratio) for m in MIXES}
        folders: dict[str, list[Path]] = {m.name: [] for m in MIXES}
        with _phase("sweeps", phases):
            # Round robin, one rate of each mix in turn (so is the bisection): a mix's fit
            # and another mix's measurement then span the same minutes of the machine.
            for name, rate in sweep_order(scale, timing):
                made = lab.loadtest(name, [rate])
                folders[name] += made
                bisections[name].add(with_load(judge(made, settings)[0]))
            speeds.append(reference_speed(server, seed + 1))
        with _phase("bisection", phases):
            for round_ in range(timing.bisection_rounds + EXTRA_ROUNDS):
                pending: dict[str, float] = {}
                for name, bisection in bisections.items():
                    bracketed = bisection.highest_pass() and bisection.lowest_fail()
                    # Past the planned rounds, only a mix without a bracket probes on.
                    if round_ >= timing.bisection_rounds and bracketed:
                        continue
                    next_rate = bisection.next_rate()
                    if next_rate is not None:
                        pending[name] = next_rate
                if not pending:
                    break
                for name, rate in pending.items():
                    made = lab.loadtest(name, [rate])
                    folders[name] += made
                    bisections[name].add(with_load(judge(made, settings)[0]))
                speeds.append(reference_speed(server, seed + 2 + round_))
        record["others_cores"] = round(gauge.others_cores(), 2)
    measured: dict[str, float | str] = {}
    for mix in MIXES:
        b = bisections[mix.name]
        cap = b.capacity()
        measured[mix.name] = cap[0] if isinstance(cap, tuple) else cap
        record["mixes"][mix.name] = {
            "describe": mix.describe(),
            "prompt_mean": float(traces[mix.name].get_column("prompt_tokens").mean()),  # type: ignore[arg-type]
            "output_mean": float(traces[mix.name].get_column("output_tokens").mean()),  # type: ignore[arg-type]
            "cached_share_ideal": mix.cached_share(traces[mix.name]),
            "server_cached_share": server_cache_share(folders[mix.name]),
            "lone_rate_rps": scale[mix.name],
            "capacity_rps": cap[0] if isinstance(cap, tuple) else cap,
            "bracket_rps": list(cap[1:]) if isinstance(cap, tuple) else None,
            "inversions": b.inversions(),
            "probes": [p.__dict__ for p in sorted(b.probes, key=lambda p: p.rate_rps)],
        }
    with _phase("fit and predict", phases):
        record["directions"], errors, withheld = predict_directions(
            folders, traces, measured, settings
        )
    change = (max(speeds) / min(speeds) - 1.0) if speeds and min(speeds) > 0 else None
    record["reference_ms"] = [round(s, 2) for s in speeds]
    record["speed_change"] = change
    result = verdict(errors, BOUND, change, NOISE_LIMIT, withheld=withheld)
    record["machine"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    record["phases"] = phases
    record["seconds"] = round(time.monotonic() - started, 1)
    record["verdict"] = {"code": result.code, "text": result.text}
    return record, result


def predict_directions(
    folders: dict[str, list[Path]],
    traces: dict[str, pl.DataFrame],
    measured: dict[str, float | str],
    settings: BenchConfig,
) -> tuple[dict[str, dict[str, Any]], dict[str, float | str], dict[str, str]]:
    """Each direction's prediction against the other mix's measured capacity: the record's
    entries, the signed errors the verdict judges (a string: why there is no number), and the
    directions the stage withholds because one mix cannot price the target's context (what the
    model would have been off by, said, not judged)."""
    entries: dict[str, dict[str, Any]] = {}
    errors: dict[str, float | str] = {}
    withheld: dict[str, str] = {}
    for fit, target in DIRECTIONS:
        key = f"{'+'.join(fit)} → {target}"
        mix = next(m for m in MIXES if m.name == target)
        prediction = predict(
            [f for name in fit for f in folders[name]], mix, traces[target], settings
        )
        got, carried = prediction.model_rps, prediction.capacity_rps
        truth = measured[target]
        entry: dict[str, Any] = {
            "predicted_rps": got.reason if isinstance(got, Unknown) else got,
            "carried_rps": carried.reason if isinstance(carried, Unknown) else carried,
            "measured_rps": truth,
            "model": model_summary(prediction.candidate),
        }
        if isinstance(got, Unknown):
            error: float | str = f"no prediction ({got.reason})"
        elif isinstance(truth, str):
            error = f"not measured ({truth})"
        else:
            error = entry["signed_error"] = signed_error(got, truth)
        if prediction.unidentified is not None:
            entry["withheld"] = prediction.unidentified
            withheld[key] = f"model {error:+.1%}" if isinstance(error, float) else error
        else:
            errors[key] = error
        entries[key] = entry
    return entries, errors, withheld


def server_cache_share(folders: Sequence[Path]) -> float | None:
    """The server's own count: cached ÷ prompt tokens over the answers that reported both."""
    frames = [pl.read_parquet(f / "loadtest-requests.parquet") for f in folders]
    done = pl.concat(frames).filter(pl.col("ok") & ~pl.col("warmup"))
    done = done.filter(pl.col("usage_cached_tokens").is_not_null())
    prompt = int(done.get_column("usage_prompt_tokens").sum())
    cached = int(done.get_column("usage_cached_tokens").sum())
    return cached / prompt if prompt else None


def load_range(mixes: Sequence[dict[str, Any]]) -> str:
    """The machine's 1-minute load average over the mixes' probes, lowest–highest."""
    loads = [
        float(p["load_average"])
        for mix in mixes
        for p in mix["probes"]
        if math.isfinite(float(p.get("load_average", math.nan)))
    ]
    return f"{min(loads):.1f}–{max(loads):.1f}" if loads else "—"


def report_lines(record: dict[str, Any]) -> list[str]:
    m = record["machine"]
    server = record["server"]
    lines = [
        "enginefit validate: the capacity model against llama.cpp's llama-server",
        f"machine: {m['cpus']} CPUs ({m['cpu']}), {m['memory_gib']} GiB; load average "
        f"{m['load_average'][0]} at start, {m['load_average_end'][0]} at end; other processes "
        f"kept {record['others_cores']} cores busy on average; {record['priority']}",
        f"model: {record['model']['file']} ({record['model']['parameters']:,} block weights, "
        f"{json.dumps(record['model']['shape'])})",
        f"server: {' '.join(server['command'])}",
        f"SLO: {Slo.model_validate(record['slo']).describe()}",
        "",
        f"{'mix':8} {'prompt':>7} {'answer':>7} {'cached':>7} {'server':>7} "
        f"{'capacity (bracket)':>26} {'load avg':>10} probes",
    ]
    for name, mix in record["mixes"].items():
        cap = mix["capacity_rps"]
        text = (
            f"{cap:.2f} ({mix['bracket_rps'][0]:.2f}–{mix['bracket_rps'][1]:.2f}) req/s"
            if isinstance(cap, float)
            else str(cap)
        )
        server_share = mix["server_cached_share"]
        lines.append(
            f"{name:8} {mix['prompt_mean']:7.0f} {mix['output_mean']:7.0f} "
            f"{mix['cached_share_ideal']:7.0%} "
            f"{'—' if server_share is None else f'{server_share:.0%}':>7} {text:>26} "
            f"{load_range([mix]):>10} {len(mix['probes'])}"
            + (f" ({mix['inversions']} inverted)" if mix["inversions"] else "")
        )
    lines += [
        "",
        f"{'fit on → predict':18} {'model':>7} {'measured':>9} {'signed error':>13} "
        f"{'load avg':>10} {'enginefit carries':>18}",
    ]
    notes: list[str] = []
    fits: dict[str, dict[str, Any]] = {}
    for key, entry in record["directions"].items():
        got, truth = entry["predicted_rps"], entry["measured_rps"]
        carried = entry["carried_rps"]
        error = entry.get("signed_error")
        lines.append(
            f"{key:18} {'unknown' if isinstance(got, str) else f'{got:.2f}':>7} "
            f"{'unknown' if isinstance(truth, str) else f'{truth:.2f}':>9} "
            f"{'—' if error is None else f'{error:+.1%}':>13} "
            f"{load_range([record['mixes'][n] for n in key.replace(' → ', '+').split('+')]):>10} "
            f"{'nothing' if isinstance(carried, str) else f'{carried:.2f}':>18}"
        )
        if isinstance(got, str):
            notes.append(f"{key}: no prediction: {got}")
        if isinstance(truth, str):
            notes.append(f"{key}: not measured: {truth}")
        fits.setdefault(key.split(" → ")[0], entry["model"])
        if "withheld" in entry:
            notes.append(f"{key}: not judged, enginefit carries nothing: {entry['withheld']}")
    lines += ["", *notes] if notes else []
    for name, model in fits.items():
        lines.append(f"fitted on {name}: {describe_fit(model)}")
        if not model.get("self_check_passed", True):
            lines.append(f"  enginefit carries nothing from it: {model['self_check']}")
    lines += [
        "",
        f"reference request (server's own ms): {record['reference_ms']}",
        f"run time {record['seconds']:.0f} s ("
        + ", ".join(f"{p['phase']} {p['seconds']:.0f} s" for p in record["phases"])
        + ")",
        record["verdict"]["text"],
    ]
    return lines


def describe_fit(model: dict[str, Any]) -> str:
    """The serving model one mix gave, and how far it is from its own points."""
    if "unknown" in model:
        return f"no serving model ({model['unknown']})"
    worst = model["worst_point_error"]
    replay = ", ".join(
        f"{stat.replace('_', ' ')} {worst[stat]:+.0%}"
        for stat in ("ttft_p50", "ttft_p95", "itl_p99", "tpot_p50")
        if stat in worst
    )
    return (
        f"step = {model['overhead_ms']:.2f} ms + {model['prefill_us_per_token']:.1f} µs × prompt "
        f"tokens + {model['decode_ms_per_request']:.2f} ms × decoding requests + "
        f"{model['context_us_per_token']:.3f} µs × context tokens ({model['context_basis']}), "
        f"attention {model['attention_ns_per_pair']:.3g} ns/pair ({model['attention_basis']}), "
        f"+ {model['request_latency_ms']:.1f} ms a request; its {model['points_used']} points "
        f"replayed, worst: {replay}"
    )


def refit(out: Path) -> tuple[dict[str, Any], Verdict]:
    """The fit-and-predict phase again on a run kept with ``--out`` (its loadtest folders,
    traces and measured capacities), with the capacity code as it is now: nothing is measured."""
    record: dict[str, Any] = json.loads((out / "validate.json").read_text(encoding="utf-8"))
    folders = {
        name: [Path(p["folder"]) for p in mix["probes"]] for name, mix in record["mixes"].items()
    }
    traces = {m.name: pl.read_parquet(out / f"trace-{m.name}.parquet") for m in MIXES}
    measured: dict[str, float | str] = {
        name: mix["capacity_rps"] for name, mix in record["mixes"].items()
    }
    record["directions"], errors, withheld = predict_directions(
        folders, traces, measured, bench_settings()
    )
    result = verdict(errors, BOUND, record["speed_change"], NOISE_LIMIT, withheld=withheld)
    record["verdict"] = {"code": result.code, "text": f"(refit) {result.text}"}
    return record, result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perf.validate", description=__doc__)
    parser.add_argument(
        "--out", type=Path, help="keep everything here (default: a temporary folder)"
    )
    parser.add_argument("--quick", action="store_true", help="shorter load points (a smoke run)")
    parser.add_argument(
        "--refit",
        type=Path,
        metavar="DIR",
        help="fit and predict again on the loadtests a run kept in DIR (no server, no load)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.refit is not None:
        if not (args.refit / "validate.json").is_file():
            print(
                f"--refit {args.refit}: no validate.json there; give the folder a run kept with "
                "--out DIR",
                file=sys.stderr,
            )
            return 2
        try:
            record, result = refit(args.refit)
        except (OSError, ValueError, KeyError) as exc:
            print(
                f"--refit {args.refit}: the kept run cannot be fitted again "
                f"({type(exc).__name__}: {exc}); run make validate with --out DIR again",
                file=sys.stderr,
            )
            return 2
        print("\n".join(report_lines(record)))
        return result.code
    timing = QUICK if args.quick else Timing()
    keep = args.out is not None
    out = args.out or Path(tempfile.mkdtemp(prefix="enginefit-validate-"))
    try:
        record, result = run(out, timing, seed=args.seed)
    except Exception as exc:  # noqa: BLE001 - any failure to measure fails the check, said once
        print(
            f"FAIL: the validation could not measure: {type(exc).__name__}: {exc}", file=sys.stderr
        )
        print(f"(everything written so far: {out})", file=sys.stderr)
        return 1
    write_bytes_atomic(
        out / "validate.json", (json.dumps(record, indent=2, default=str) + "\n").encode()
    )
    print("\n".join(report_lines(record)))
    if keep:
        print(f"written: {out}")
    else:
        shutil.rmtree(out, ignore_errors=True)
    return result.code


if __name__ == "__main__":
    sys.exit(main())
