"""Every rule's fixed threshold, once. The decision rules and triggers, the bench stage's validity
checks, the prefix stage's curve classification and the shape findings read them here, and their
sentences are formatted from them, never typed beside them. Each is explained with its sources
in docs/decision-rules.md; a team sets requirements, not these, so they are constants rather
than options (the configurable limits live in pipeline/defaults.yaml).
"""

from __future__ import annotations

# --- concurrency (docs/decision-rules.md#concurrency)
# A peak concurrency at or below this leaves little to batch (llama.cpp / Ollama territory)...
CONCURRENCY_LOW_MAX = 2.0
# ...and a peak at or above this needs vLLM or SGLang (Ollama is out).
CONCURRENCY_HIGH_MIN = 10.0
# Poisson arrivals give CV = index of dispersion = 1; sampling noise and quantisation aliasing
# move that by a few tenths, so "clearly bursty" starts here.
BURSTY = 2.0
# The narrowest weights every datacenter engine serves first-class: FP8 or INT8. Weights that fit
# the GPUs only narrower (2-6-bit, llama.cpp's GGUF formats) are what points a low-concurrency
# datacenter workload to llama.cpp / Ollama.
DATACENTER_WEIGHT_BITS = 8
DATACENTER_WEIGHT_BYTES = DATACENTER_WEIGHT_BITS / 8

# --- prefix sharing (docs/decision-rules.md#prefix-sharing, docs/prefix.md#definitions)
# The shared-prefix ratio the prefix rules read is the curve's share at this window (tokens;
# the largest curve window not above it).
PREFIX_WINDOW_TOKENS = 1024
# A shared-prefix ratio above this calls for benchmarking SGLang against vLLM on the traffic
# (the validity check flags a unique-prompt benchmark against such traffic)...
PREFIX_HEAVY_SHARE = 0.5
# ...and below this the published SGLang-vs-vLLM margins do not apply (the validity check flags
# a shared-prefix benchmark against such traffic; the curve classification calls it no sharing).
PREFIX_LIGHT_SHARE = 0.2
# The curve-shape classification reads the share at a short window of at least this many tokens
# (a system prompt's length)...
CLASSIFY_SHORT_WINDOW_TOKENS = 256
# ...and at a long window of at most this many (capped at the median prompt); share(long) ÷
# share(short) at or above LONG_CONTEXT_RETENTION is "long shared context".
CLASSIFY_LONG_WINDOW_TOKENS = 4096
LONG_CONTEXT_RETENTION = 0.5
# A prefix-aware routing layer is recommended when the best simulated routing saves at least
# this share of prompt tokens from prefill compared with round-robin.
ROUTING_GAIN_MIN = 0.1

# --- transferability (docs/decision-rules.md#transferability)
# Benchmark prompts with p99/p50 at or below this count as one fixed length...
FIXED_SPREAD = 1.05
# ...flagged when production's prompt p99/p50 is at or above this (the long prompts that
# exercise chunked prefill are missing from them).
TAIL_RATIO = 2.0
# A benchmark median prompt or output length off production's by more than this factor either
# way is flagged: latency at another length says little about ours. The capacity stage's
# transfer of a fitted serving model to the workload's mix is provisional past the same factor
# (one threshold for both stages: a benchmark the bench stage flags is never carried to the
# workload as if it were close).
LENGTH_FACTOR = 2.0
# A percentile judged with fewer than this many requests expected above it carries its
# confidence interval: 10 gives a p99 about 1,000 requests, whose 95 % interval spans the
# sample's 983rd to 997th values (a p99 of 100 requests is their maximum).
TAIL_REQUESTS_ABOVE = 10

# --- model churn (docs/decision-rules.md#model-churn, the TensorRT-LLM branch: "one or two
# stable models, NVIDIA, huge volume")
# Huge is at least this many output tokens a month at the workload's mean rate...
HIGH_VOLUME_OUTPUT_TOKENS_PER_MONTH = 10_000_000_000.0
# ...few is at most this many models...
TRT_MAX_MODELS = 2
# ...and stable is at most this many model changes a quarter (a change restarts TensorRT-LLM, but
# a model of a new architecture runs on it only once it implements it).
TRT_MAX_CHANGES_PER_QUARTER = 1.0

# --- features and age
# A prompt p99 at or above this many tokens makes long_context a required feature.
LONG_CONTEXT_TOKENS = 32768
# Engines release every few weeks: a revisit trigger fires when the oldest catalog fact a
# decision used (its evidence date) is older than this many days (about six months).
CATALOG_MAX_AGE_DAYS = 183


def tokens_k(tokens: int) -> str:
    """A token count in thousands of 1,024 as a sentence writes it (32768 → ``32k``)."""
    return f"{tokens // 1024}k"
