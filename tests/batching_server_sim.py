"""An independent continuous-batching server for the capacity tests (shares no code and no
formula with ``pipeline.capacity``, and differs from its model where real engines do).

The "GPU" here costs, per iteration:

    fixed_ms                                   kernel launches + reading the weights once
  + linear_ms × (prompt tokens computed)       the matrix multiplies of prefill chunks
  + attention_ms × Σ chunk × (offset + chunk/2) causal attention of each chunk over what came
                                               before it in its own prompt: quadratic in length
  + per_sequence_ms × (sequences decoding)     sampling, the decode token's matmul rows
  + kv_read_ms × (KV tokens the decodes attend to)
  × a log-normal jitter per iteration (noise of a real server).

Scheduling imitates vLLM's V1 scheduler, not the product's model of it:

* **running requests first**, oldest first: each decode takes one token of the step's budget
  (``token_budget``, which the sweeps' manifests do not state: the fit must find it), an
  unfinished prompt the next chunk of what is left; then **waiting requests** in arrival order
  while the batch has room (``max_seqs``) and budget is left;
* **KV allocated as tokens arrive**, in blocks of ``kv_block_tokens``, from a pool of
  ``kv_pool_tokens`` (the product reserves a request's whole prompt + answer at admission);
  when a running request needs a block and none is free, the youngest running request is
  **preempted**: its blocks are freed and it goes back to the head of the queue, to prefill
  its prompt and the tokens it had generated again (recompute), its next token coming out of
  that prefill;
* **head-of-line blocking**: a waiting request that cannot get the blocks of its first chunk,
  or (chunked prefill off) whose whole prompt does not fit the budget left, stops admission
  for everyone behind it;
* **chunked prefill off** (``chunked_prefill=False``, TensorRT-LLM's default): a prompt is
  prefilled in one step or waits; one longer than the whole budget goes alone when no other
  prompt is in the step.

A prefix-cache hit skips those prompt tokens (they still sit in the KV and are attended to;
a preempted request keeps them).

Clients: an open-loop client at a fixed rate (``simulate``; Poisson, or Gamma gaps of a given
coefficient of variation for bursty traffic), each request with its own prefix-cache hit
(:func:`cache_hits`), recording what vLLM ``bench serve`` records; :func:`write_vllm_result`
turns a run into a real result JSON with the per-request arrays, and :func:`find_capacity` is the simulator's own search for the largest rate
meeting an SLO with a queue that keeps up (a grid of rates, then bisection).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numba as nb
import numpy as np

RUNNING_NONE = -1


@dataclass(frozen=True)
class GpuServer:
    """A Llama-3.1-8B-like model on one H100 (illustrative constants, roofline-shaped)."""

    fixed_ms: float = 6.0
    linear_ms: float = 0.028
    attention_ms: float = 1.3e-6
    per_sequence_ms: float = 0.03
    kv_read_ms: float = 5.4e-5
    jitter_sigma: float = 0.03
    token_budget: int = 1024
    max_seqs: int = 256
    kv_pool_tokens: int = 450_000
    kv_block_tokens: int = 16
    chunked_prefill: bool = True
    api_latency_ms: float = 0.0  # HTTP + tokenising before the request reaches the scheduler

    def scaled(self, **changes: Any) -> GpuServer:
        values = {**self.__dict__, **changes}
        return GpuServer(**values)


@dataclass
class ServedRun:
    """What a client recorded, in send order (seconds)."""

    rate: float
    start: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    ttft: np.ndarray
    latency: np.ndarray
    itl_flat: np.ndarray
    itl_offsets: np.ndarray
    busy_prefill_ms: float
    busy_cached_kv_ms: float
    busy_total_ms: float
    end: float
    preemptions: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def itl_of(self, i: int) -> np.ndarray:
        return self.itl_flat[self.itl_offsets[i] : self.itl_offsets[i + 1]]


@nb.njit(cache=True)
def _blocks(tokens: int, block: int) -> int:
    return (tokens + block - 1) // block


@nb.njit(cache=True)
def _serve(
    send_s: np.ndarray,
    prompt: np.ndarray,
    skip: np.ndarray,
    answer: np.ndarray,
    fixed: float,
    linear: float,
    attention: float,
    per_seq: float,
    kv_read: float,
    noise: np.ndarray,
    budget: int,
    max_seqs: int,
    kv_pool: int,
    block: int,
    chunked: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, float, float, float, int]:
    n = send_s.shape[0]
    target = prompt.copy()  # tokens to prefill before decoding (grows on a preemption)
    computed = skip.copy()  # tokens whose KV is stored (cache hits count as computed)
    produced = np.zeros(n, dtype=np.int64)
    held = np.zeros(n, dtype=np.int64)  # KV blocks held
    first = np.full(n, -1.0)
    done_at = np.full(n, -1.0)
    last_at = np.zeros(n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        offsets[i + 1] = offsets[i] + answer[i] - 1
    itl = np.zeros(offsets[n])
    free_blocks = kv_pool // block
    ring = np.empty(n, dtype=np.int64)  # the waiting queue
    head = 0
    waiting = 0
    running = np.empty(n, dtype=np.int64)  # oldest first
    n_run = 0
    scheduled = np.zeros(n, dtype=np.int64)  # tokens scheduled for a request this step
    decoding = np.zeros(n, dtype=np.bool_)
    arrived = 0
    clock = 0.0
    remaining = n
    iteration = 0
    preemptions = 0
    busy_prefill = 0.0
    busy_cached = 0.0
    busy_total = 0.0
    while remaining > 0:
        if n_run == 0 and waiting == 0 and arrived < n and send_s[arrived] > clock:
            clock = send_s[arrived]
        while arrived < n and send_s[arrived] <= clock:
            ring[(head + waiting) % n] = arrived
            waiting += 1
            arrived += 1
        left = budget
        cost = fixed
        prefill_cost = 0.0
        cached_cost = 0.0
        decoders = 0
        prompt_tokens = 0
        i = 0
        while i < n_run:
            r = running[i]
            is_decode = computed[r] >= target[r]
            want = 1 if is_decode else min(target[r] - computed[r], left)
            if want <= 0:
                scheduled[r] = 0
                i += 1
                continue
            need = _blocks(computed[r] + want, block) - held[r]
            preempted_self = False
            while need > free_blocks:
                victim = running[n_run - 1]
                free_blocks += held[victim]
                held[victim] = 0
                target[victim] = prompt[victim] + produced[victim]
                computed[victim] = skip[victim]
                scheduled[victim] = 0
                head = (head - 1 + n) % n
                ring[head] = victim
                waiting += 1
                n_run -= 1
                preemptions += 1
                if victim == r:
                    preempted_self = True
                    break
            if preempted_self:
                continue
            held[r] += need
            free_blocks -= need
            scheduled[r] = want
            decoding[r] = is_decode
            left -= want
            if is_decode:
                decoders += 1
                cost += per_seq + kv_read * computed[r]
                cached_cost += kv_read * skip[r]
            else:
                prompt_tokens += want
                work = linear * want + attention * want * (computed[r] + want / 2.0)
                cost += work
                prefill_cost += work
            i += 1
        while waiting > 0 and n_run < max_seqs and left > 0:
            r = ring[head]
            want = target[r] - computed[r]
            if want > left:
                if chunked:
                    want = left
                elif prompt_tokens > 0 or want <= budget:
                    break  # whole prompts only: it and everyone behind it wait
            need = _blocks(computed[r] + want, block) - held[r]
            if need > free_blocks:
                break  # no KV for its first chunk: it and everyone behind it wait
            head = (head + 1) % n
            waiting -= 1
            running[n_run] = r
            n_run += 1
            held[r] += need
            free_blocks -= need
            scheduled[r] = want
            decoding[r] = False
            left -= want
            prompt_tokens += want
            work = linear * want + attention * want * (computed[r] + want / 2.0)
            cost += work
            prefill_cost += work
        if decoders == 0 and prompt_tokens == 0:
            if arrived < n:
                clock = max(clock, send_s[arrived])
            continue
        if prompt_tokens > 0:
            prefill_cost += fixed * prompt_tokens / (prompt_tokens + decoders)
        cost *= noise[iteration % noise.shape[0]]
        iteration += 1
        clock += cost / 1000.0
        busy_total += cost
        busy_prefill += prefill_cost
        busy_cached += cached_cost
        kept = 0
        for i in range(n_run):
            r = running[i]
            step = scheduled[r]
            scheduled[r] = 0
            finished = False
            if step > 0:
                computed[r] += step
                emits = decoding[r] or computed[r] >= target[r]
                if emits and produced[r] == 0:
                    first[r] = clock - send_s[r]
                    produced[r] = 1
                    last_at[r] = clock
                    finished = answer[r] == 1
                elif emits:
                    itl[offsets[r] + produced[r] - 1] = clock - last_at[r]
                    produced[r] += 1
                    last_at[r] = clock
                    finished = produced[r] == answer[r]
            if finished:
                done_at[r] = clock - send_s[r]
                free_blocks += held[r]
                held[r] = 0
                remaining -= 1
            else:
                running[kept] = r
                kept += 1
        n_run = kept
    return first, done_at, itl, offsets, busy_prefill, busy_cached, busy_total, clock, preemptions


def simulate(
    server: GpuServer,
    rate: float,
    prompt: np.ndarray,
    output: np.ndarray,
    cached: np.ndarray | None = None,
    seed: int = 0,
    cv: float = 1.0,
) -> ServedRun:
    """An open-loop client at ``rate`` req/s sending these requests in this order: Poisson, or
    with ``cv`` ≠ 1 Gamma gaps of that coefficient of variation (shape 1/cv²: bursts and lulls
    around the same mean rate). ``cached``: each request's prompt tokens already in the KV."""
    rng = np.random.default_rng(seed)
    n = prompt.shape[0]
    gaps = rng.exponential(1.0 / rate, n) if cv == 1.0 else rng.gamma(1.0 / cv**2, cv**2 / rate, n)
    send = np.cumsum(gaps)
    send -= send[0]
    api = server.api_latency_ms / 1000.0
    skip = np.zeros(n, dtype=np.int64) if cached is None else np.minimum(cached, prompt - 1)
    noise = (
        np.exp(rng.normal(0.0, server.jitter_sigma, 4096)) if server.jitter_sigma else np.ones(1)
    )
    assert int(np.max(prompt + output)) <= server.kv_pool_tokens, "a request exceeds the KV pool"
    first, done, itl, offsets, pre, cac, total, end, preemptions = _serve(
        send + api,
        prompt.astype(np.int64),
        skip.astype(np.int64),
        output.astype(np.int64),
        server.fixed_ms,
        server.linear_ms,
        server.attention_ms,
        server.per_sequence_ms,
        server.kv_read_ms,
        noise,
        server.token_budget,
        server.max_seqs,
        server.kv_pool_tokens,
        server.kv_block_tokens,
        server.chunked_prefill,
    )
    return ServedRun(
        rate=rate,
        start=send,
        prompt=prompt,
        output=output,
        ttft=first + api,
        latency=done + api,
        itl_flat=itl,
        itl_offsets=offsets,
        busy_prefill_ms=float(pre),
        busy_cached_kv_ms=float(cac),
        busy_total_ms=float(total),
        end=float(end),
        preemptions=int(preemptions),
    )


@dataclass(frozen=True)
class Verdict:
    ok: bool
    ttft_p95_ms: float
    itl_p99_ms: float
    backlog_grew: bool


def judge(
    run: ServedRun,
    ttft_p95_ms: float,
    itl_p99_ms: float,
    warmup: float = 0.1,
    verdict_only: bool = False,
) -> Verdict:
    """The SLO on the requests after the warm-up, and whether the server kept up: the requests
    still unanswered at the last send must not outnumber those at mid-run by much.

    ``verdict_only``: the same ``ok``, but the p99 ITL is computed only when counting the gaps
    above the limit cannot settle it (``itl_p99_ms`` is ``nan`` when counting did)."""
    n = run.start.shape[0]
    skip = int(n * warmup)
    ttft = np.percentile(run.ttft[skip:], 95) * 1000.0
    keep = run.itl_offsets[skip]
    gaps = run.itl_flat[keep:]
    settled = _p99_settled(gaps, itl_p99_ms) if verdict_only else None
    itl = np.nan
    if settled is None:
        itl = np.percentile(gaps, 99) * 1000.0 if gaps.size else 0.0
    finish = run.start + run.latency

    def open_at(t: float) -> int:
        return int(np.sum((run.start <= t) & (finish > t)))

    middle, last = run.start[n // 2], run.start[-1]
    grew = open_at(last) > 2 * open_at(middle) + 10
    itl_ok = bool(settled) if settled is not None else itl <= itl_p99_ms
    return Verdict(
        ok=bool(ttft <= ttft_p95_ms and itl_ok and not grew),
        ttft_p95_ms=float(ttft),
        itl_p99_ms=float(itl),
        backlog_grew=grew,
    )


def _p99_settled(gaps: np.ndarray, limit_ms: float) -> bool | None:
    """Whether the p99 of ``gaps`` (seconds; ``np.percentile``'s linear one, between the sorted
    values k and k + 1, k = ⌊0.99 (m − 1)⌋), in ms, is within ``limit_ms``, from how many gaps
    exceed it (compared as ``judge`` compares, × 1000): above when value k − 1 already is,
    within when value k + 2 still is (a margin of one index each side of k), else ``None`` (the
    percentile itself decides). Counting is a tenth of the percentile's partial sort on a run's
    million gaps."""
    m = gaps.size
    if m == 0:
        return True
    k = int(np.floor(0.99 * (m - 1)))
    above = int(np.count_nonzero(gaps * 1000.0 > limit_ms))
    if k >= 1 and above >= m - k + 1:  # sorted[k - 1] > limit: the p99 ≥ sorted[k] is too
        return False
    if k + 2 <= m - 1 and above <= m - k - 3:  # sorted[k + 2] ≤ limit: so is the p99
        return True
    return None


def find_capacity(
    server: GpuServer,
    prompt: np.ndarray,
    output: np.ndarray,
    cached: np.ndarray | None,
    ttft_p95_ms: float,
    itl_p99_ms: float,
    seed: int = 7,
    start: float = 0.05,
    cv: float = 1.0,
    halvings: int = 8,
) -> tuple[float, ServedRun]:
    """The largest rate meeting the SLO and keeping up (arrivals as :func:`simulate` sends
    them): a ×1.5 grid up from ``start`` (which must pass), then halving the last bracket
    ``halvings`` times."""

    def ok(rate: float) -> tuple[bool, ServedRun]:
        run = simulate(server, rate, prompt, output, cached, seed=seed, cv=cv)
        return judge(run, ttft_p95_ms, itl_p99_ms, verdict_only=True).ok, run

    rate = start
    passed, run = ok(rate)
    assert passed, f"the SLO fails even at {start} req/s"
    best_run = run
    while True:
        nxt = rate * 1.5
        passed, run = ok(nxt)
        if not passed:
            break
        rate, best_run = nxt, run
    lo, hi = rate, rate * 1.5
    for _ in range(halvings):
        mid = (lo + hi) / 2.0
        passed, run = ok(mid)
        if passed:
            lo, best_run = mid, run
        else:
            hi = mid
    return lo, best_run


def write_vllm_result(
    run: ServedRun, path: Path, model_id: str, num_prompts: int | None = None
) -> None:
    """A ``vllm bench serve --save-result`` JSON for ``run`` (ms aggregates, s arrays)."""
    n = run.start.shape[0]
    ttft_ms = run.ttft * 1000.0
    tpot = np.array(
        [
            (run.latency[i] - run.ttft[i]) / (run.output[i] - 1) * 1000.0
            for i in range(n)
            if run.output[i] > 1
        ]
    )
    itl_ms = run.itl_flat * 1000.0
    duration = float(np.max(run.start + run.latency))
    doc: dict[str, Any] = {
        "date": "20261130-120000",
        "endpoint_type": "openai",
        "backend": "vllm",
        "label": None,
        "model_id": model_id,
        "tokenizer_id": model_id,
        "num_prompts": num_prompts or n,
        "request_rate": run.rate,
        "burstiness": 1.0,
        "max_concurrency": None,
        "duration": duration,
        "completed": n,
        "failed": 0,
        "total_input_tokens": int(run.prompt.sum()),
        "total_output_tokens": int(run.output.sum()),
        "request_throughput": n / duration,
        "request_goodput": None,
        "output_throughput": float(run.output.sum()) / duration,
        "total_token_throughput": float(run.prompt.sum() + run.output.sum()) / duration,
        "max_output_tokens_per_s": None,
        "max_concurrent_requests": None,
    }
    for name, values in (("ttft", ttft_ms), ("tpot", tpot), ("itl", itl_ms)):
        doc[f"mean_{name}_ms"] = float(np.mean(values))
        doc[f"median_{name}_ms"] = float(np.median(values))
        doc[f"std_{name}_ms"] = float(np.std(values))
        doc[f"p99_{name}_ms"] = float(np.percentile(values, 99))
    doc["input_lens"] = [int(x) for x in run.prompt]
    doc["output_lens"] = [int(x) for x in run.output]
    doc["ttfts"] = [float(x) for x in run.ttft]
    doc["itls"] = [[float(g) for g in run.itl_of(i)] for i in range(n)]
    doc["latencies"] = [float(x) for x in run.latency]
    doc["start_times"] = [float(1000.0 + x) for x in run.start]  # perf_counter, not from 0
    doc["errors"] = [""] * n
    doc["generated_texts"] = [""] * n
    path.write_text(json.dumps(doc))


def write_sweep(
    server: GpuServer,
    folder: Path,
    rates: list[float],
    prompt: np.ndarray,
    output: np.ndarray,
    *,
    gpu_type: str = "H100-80GB",
    price: float = 2.5,
    model_id: str = "meta-llama/Llama-3.1-8B-Instruct",
    seed: int = 11,
    engine: str = "vllm",
    engine_args: dict[str, Any] | None = None,
) -> list[ServedRun]:
    """One vLLM result file per rate for one request mix, with the sidecar manifest (its
    ``engine_args`` only when given: by default the fit is not told the server's limits)."""
    folder.mkdir(parents=True, exist_ok=True)
    runs = []
    for k, rate in enumerate(rates):
        run = simulate(server, rate, prompt, output, seed=seed + k)
        write_vllm_result(run, folder / f"vllm-{rate:g}qps-Llama-3.1-8B.json", model_id)
        runs.append(run)
    manifest: dict[str, Any] = {
        "engine": engine,
        "engine_version": "0.11.0",
        "gpu_type": gpu_type,
        "gpu_count": 1,
        "quantization": "bf16",
        "price_per_gpu_hour_usd": price,
        "model": model_id,
        "workload": "synthetic",
    }
    if engine_args is not None:  # {}: the server was started with the engine's defaults
        manifest["engine_args"] = engine_args
    (folder / "enginefit-bench.yaml").write_text(json.dumps(manifest))
    return runs


def mix(
    n: int, prompt_range: tuple[int, int], output_range: tuple[int, int], seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Uniform prompt and output lengths (integers, inclusive ranges)."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(prompt_range[0], prompt_range[1] + 1, n).astype(np.int64)
    output = rng.integers(output_range[0], output_range[1] + 1, n).astype(np.int64)
    return prompt, output


def cache_hits(prompt: np.ndarray, share: float, seed: int) -> np.ndarray:
    """Per-request prefix-cache hits averaging ``share`` of the prompt tokens: request i has
    ⌊u_i × prompt_i⌋ cached, u_i uniform on [max(0, 2·share − 1), min(1, 2·share)] (some
    requests nearly uncached, others mostly cached, as a shared prefix serves them)."""
    rng = np.random.default_rng(seed)
    u = rng.uniform(max(0.0, 2 * share - 1), min(1.0, 2 * share), prompt.shape[0])
    return np.floor(u * prompt).astype(np.int64)


PER_REQUEST_KEYS = (
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "latencies",
    "start_times",
    "errors",
    "generated_texts",
)


def strip_per_request(path: Path) -> None:
    """The same result as written by a vLLM version that kept aggregates only."""
    doc = json.loads(path.read_text())
    for key in PER_REQUEST_KEYS:
        doc.pop(key, None)
    path.write_text(json.dumps(doc))
