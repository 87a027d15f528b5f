"""The server simulation (numba): one continuous-batching replica, step by step.

The model (docs/capacity.md): a replica runs in *steps*. Each step

1. admits waiting requests first come, first served while the running set is below
   ``max_batch`` and the KV cache can reserve the request's prompt + output tokens
   (``kv_tokens``; reserving the whole answer up front is conservative: vLLM allocates blocks as
   tokens arrive and preempts when it runs out, which this model does not reproduce);
2. gives every decoding request one token of the step's token budget (``token_budget``, vLLM's
   ``max_num_batched_tokens``; decodes are scheduled before prefills, as in vLLM's V1
   scheduler), then hands the rest of the budget to unfinished prompts in admission order
   (chunked prefill: a prompt longer than what is left is split across steps). With chunked
   prefill off (``chunked_prefill=False``, TensorRT-LLM's default) a prompt is prefilled whole
   or not at all: the first one that does not fit what is left stops the prefills of the step
   (head-of-line), and one larger than the whole budget runs alone in a step of its own;
3. lasts ``step_s = overhead + prefill·(uncached prompt tokens in the step)
   + attention·Σ chunk·(tokens before it in its prompt + chunk/2)
   + decode·(decoding requests) + context·(context tokens the decodes read)``:
   the attention term is causal attention of each prefill chunk over its prompt so far, which
   grows with the square of the prompt (a whole prompt of P tokens: P²/2 token pairs).

A prompt's last chunk ends in its first token (TTFT = its arrival to that step's end); every
later step emits one token per decoding request (one inter-token gap = that step's length).
Prefix-cache hits are removed from the prompt's prefill work before the simulation
(``uncached``) but still count as context the decodes read.

What held the server back is counted for the binding limit (``pipeline.capacity.binding``):
steps in which an arrived request could not be admitted for KV memory or for ``max_batch``,
steps whose prefill budget ran out while prompt tokens were still waiting, and the most prompt
tokens prefilled in a step that ended an inter-token gap.

Nothing here allocates per step, and a step's work does not grow with the decoding batch: the
prefilling requests are a range of the admission order, the decodes a count (with their context
tokens kept up to date) and a heap of the steps they end in, and a decode's inter-token gaps,
the lengths of the steps after its first token's, are written at the end from the steps' end
times into one array sized Σ(output − 1) by the caller's wrapper.
"""

from __future__ import annotations

from typing import NamedTuple

import numba as nb
import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]


class SimulatedRun(NamedTuple):
    """What one simulated run gives back, per request (seconds) and in total."""

    ttft_s: F64  # arrival → first token
    e2e_s: F64  # arrival → last token
    wait_s: F64  # arrival → admission (queueing for a batch slot or KV memory)
    gaps_s: F64  # every inter-token gap, pooled (request order, then token order)
    #: request r's gaps are ``gaps_s[gap_start[r] : gap_start[r + 1]]`` (to drop warm-up ones)
    gap_start: I64
    busy_s: float  # sum of step lengths
    prefill_s: float  # prefill work + the overhead share of prefill tokens
    cached_context_s: float  # context reads of prefix-cached prompt tokens
    end_s: float  # when the last request finished
    steps: int = 0
    kv_blocked_steps: int = 0  # an arrived request waited for KV memory
    batch_blocked_steps: int = 0  # an arrived request waited for a max_batch slot
    budget_full_steps: int = 0  # prompt tokens waited for the next step's budget
    #: the most prompt tokens prefilled in a step that ended a gap (0 without gaps)
    gap_prefill_max: int = 0


@nb.njit(cache=True, inline="always")
def _push(heap: I64, size: int, key: int) -> int:
    """Add ``key`` to the min-heap ``heap[:size]``; returns the new size."""
    i = size
    heap[i] = key
    while i > 0:
        parent = (i - 1) >> 1
        if heap[parent] <= heap[i]:
            break
        heap[parent], heap[i] = heap[i], heap[parent]
        i = parent
    return size + 1


@nb.njit(cache=True, inline="always")
def _pop(heap: I64, size: int) -> int:
    """Drop the least key of the min-heap ``heap[:size]``; returns the new size."""
    size -= 1
    heap[0] = heap[size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and heap[child + 1] < heap[child]:
            child += 1
        if heap[i] <= heap[child]:
            break
        heap[child], heap[i] = heap[i], heap[child]
        i = child
    return size


@nb.njit(cache=True)
def _simulate(
    arrivals: F64,
    prompt: I64,
    uncached: I64,
    output: I64,
    overhead_s: float,
    prefill_s: float,
    attention_s: float,
    decode_s: float,
    context_s: float,
    token_budget: int,
    max_batch: int,
    kv_tokens: int,
    chunked_prefill: bool,
    gap_start: I64,
    gaps: F64,
) -> tuple[F64, F64, F64, float, float, float, float, I64]:
    n = arrivals.shape[0]
    ttft = np.full(n, np.nan)
    e2e = np.full(n, np.nan)
    wait = np.full(n, np.nan)
    # steps, KV-blocked, batch-blocked, budget-full, most prefill tokens in a gap-ending step
    counters = np.zeros(5, dtype=np.int64)
    remaining_prefill = uncached.copy()
    chunk = np.zeros(n, dtype=np.int64)
    # A decoding request emits one token every step until its last, so its gaps are the
    # lengths of the steps after its first token's: the steps' end times are kept
    # (``step_end``, grown as needed) and the gaps written from them at the end, and the step
    # each request ends in is known when its first token comes (``ending``: a min-heap of
    # step × n + request).
    first_step = np.full(n, -1, dtype=np.int64)
    step_end = np.empty(n + 1024)
    ending = np.empty(n, dtype=np.int64)
    n_ending = 0
    # The running set: ``n_decode`` decoding requests and the prefilling ones, requests
    # ``first_prefill .. next_admit - 1``: prompts get the budget in admission order and all but
    # the last one served in a step finish, so prefills end in admission order. The decodes'
    # context tokens are kept up to date as they change.
    n_decode = 0
    first_prefill = 0
    context = 0
    cached_context = 0
    n_running = 0
    next_admit = 0
    kv_used = 0
    finished = 0
    steps = 0
    t = 0.0
    busy = 0.0
    prefill_time = 0.0
    cached_time = 0.0
    while finished < n:
        if n_running == 0 and next_admit < n and arrivals[next_admit] > t:
            t = arrivals[next_admit]  # idle until the next request arrives
        while (
            next_admit < n
            and arrivals[next_admit] <= t
            and n_running < max_batch
            and kv_used + prompt[next_admit] + output[next_admit] <= kv_tokens
        ):
            r = next_admit
            n_running += 1
            kv_used += prompt[r] + output[r]
            wait[r] = t - arrivals[r]
            next_admit += 1
        if next_admit < n and arrivals[next_admit] <= t:
            if n_running >= max_batch:
                counters[2] += 1
            else:
                counters[1] += 1
        if n_running == 0:
            # nothing fits even in an empty replica: the caller checks sizes first
            break
        budget = token_budget - n_decode
        prefill_tokens = 0
        pairs = 0.0
        waiting_prefill = False
        served = first_prefill  # requests first_prefill .. served - 1 get a chunk this step
        for r in range(first_prefill, next_admit):
            if budget <= 0:
                waiting_prefill = True  # this one and those behind it wait
                break
            left = remaining_prefill[r]
            take = min(left, budget)
            if not chunked_prefill and take < left:
                if prefill_tokens > 0 or left <= token_budget:
                    waiting_prefill = True  # whole prompts only: this one and those behind wait
                    break
                take = left  # larger than the whole budget: alone in its step
            chunk[r] = take
            budget -= take
            prefill_tokens += take
            before = prompt[r] - left  # cached prefix + chunks done
            pairs += take * (before + take / 2.0)
            served = r + 1
            if take < left:
                waiting_prefill = True
        if waiting_prefill:
            counters[3] += 1
        prefill_work = prefill_s * prefill_tokens + attention_s * pairs
        step = overhead_s + prefill_work + decode_s * n_decode + context_s * context
        t += step
        busy += step
        tokens = prefill_tokens + n_decode
        if tokens > 0:
            prefill_time += prefill_work + overhead_s * prefill_tokens / tokens
        cached_time += context_s * cached_context
        if steps == step_end.size:
            step_end = np.concatenate((step_end, np.empty(steps)))
        step_end[steps] = t
        if n_decode > 0 and prefill_tokens > counters[4]:  # a step with decodes ends gaps
            counters[4] = prefill_tokens
        kept = n_decode
        while n_ending > 0 and ending[0] // n == steps:  # decodes whose last token this was
            r = ending[0] % n
            n_ending = _pop(ending, n_ending)
            e2e[r] = t - arrivals[r]
            kv_used -= prompt[r] + output[r]
            finished += 1
            context -= prompt[r] + output[r] - 1  # what it read this step
            cached_context -= prompt[r] - uncached[r]
            kept -= 1
        context += kept  # every decode still running holds one token more
        for r in range(first_prefill, served):
            remaining_prefill[r] -= chunk[r]
            if remaining_prefill[r] > 0:
                break  # the last one served, part done
            first_prefill = r + 1
            ttft[r] = t - arrivals[r]
            first_step[r] = steps
            if output[r] <= 1:
                e2e[r] = t - arrivals[r]
                kv_used -= prompt[r] + output[r]
                finished += 1
            else:
                n_ending = _push(ending, n_ending, (steps + output[r] - 1) * n + r)
                kept += 1
                context += prompt[r] + 1
                cached_context += prompt[r] - uncached[r]
        n_decode = kept
        n_running = n_decode + next_admit - first_prefill
        steps += 1
    counters[0] = steps
    for r in range(n):
        s = first_step[r]
        k = gap_start[r]
        if s < 0:
            continue
        for j in range(gap_start[r + 1] - k):
            # t - the previous token's time, as the step that ended the gap measured it
            gaps[k + j] = step_end[s + 1 + j] - step_end[s + j]
    return ttft, e2e, wait, busy, prefill_time, cached_time, t, counters


def simulate_replica(
    arrivals_s: F64,
    prompt_tokens: I64,
    uncached_tokens: I64,
    output_tokens: I64,
    *,
    overhead_s: float,
    prefill_s_per_token: float,
    attention_s_per_pair: float,
    decode_s_per_request: float,
    context_s_per_token: float,
    token_budget: int,
    max_batch: int,
    kv_tokens: int,
    chunked_prefill: bool = True,
) -> SimulatedRun:
    """Simulate one replica serving requests arriving at ``arrivals_s`` (sorted ascending).

    Raises ``ValueError`` for inputs the kernel cannot index safely (numba does not bounds-
    check): mismatched lengths, unsorted arrivals, uncached tokens outside [1, prompt], outputs
    below 1, or a request that can never fit the KV cache.
    """
    n = arrivals_s.shape[0]
    for name, arr in (("prompt", prompt_tokens), ("uncached", uncached_tokens)):
        if arr.shape[0] != n:
            raise ValueError(f"{name} has {arr.shape[0]} entries, arrivals {n}")
    if output_tokens.shape[0] != n:
        raise ValueError(f"output has {output_tokens.shape[0]} entries, arrivals {n}")
    if n and np.any(np.diff(arrivals_s) < 0):
        raise ValueError("arrivals must be sorted ascending")
    if np.any(output_tokens < 1) or np.any(uncached_tokens < 1):
        raise ValueError("every request needs at least one output and one uncached token")
    if np.any(uncached_tokens > prompt_tokens):
        raise ValueError("uncached prompt tokens cannot exceed the prompt")
    if n and int(np.max(prompt_tokens + output_tokens)) > kv_tokens:
        raise ValueError("a request is larger than the replica's KV cache")
    if token_budget < 1 or max_batch < 1:
        raise ValueError("token_budget and max_batch must be positive")
    gap_start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(output_tokens - 1, out=gap_start[1:])
    # Every inter-token gap, one value each: millions at a few thousand answers. Allocated by
    # numpy, which asks for transparent huge pages on large arrays (numba's allocator does
    # not): fresh 4 KiB pages, one fault each, cost more than the whole simulation.
    total = int(gap_start[n])
    gaps = np.empty(total)
    result = _simulate(
        np.ascontiguousarray(arrivals_s, dtype=np.float64),
        np.ascontiguousarray(prompt_tokens, dtype=np.int64),
        np.ascontiguousarray(uncached_tokens, dtype=np.int64),
        np.ascontiguousarray(output_tokens, dtype=np.int64),
        float(overhead_s),
        float(prefill_s_per_token),
        float(attention_s_per_pair),
        float(decode_s_per_request),
        float(context_s_per_token),
        int(token_budget),
        int(max_batch),
        int(kv_tokens),
        bool(chunked_prefill),
        gap_start,
        gaps,
    )
    ttft, e2e, wait, busy, prefill_time, cached_time, end, counts = result
    return SimulatedRun(
        ttft_s=ttft,
        e2e_s=e2e,
        wait_s=wait,
        gaps_s=gaps,
        gap_start=gap_start,
        busy_s=float(busy),
        prefill_s=float(prefill_time),
        cached_context_s=float(cached_time),
        end_s=float(end),
        steps=int(counts[0]),
        kv_blocked_steps=int(counts[1]),
        batch_blocked_steps=int(counts[2]),
        budget_full_steps=int(counts[3]),
        gap_prefill_max=int(counts[4]),
    )
