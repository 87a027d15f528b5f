"""The fleet's own prefix cache: how many of each request's prompt tokens its replica already
holds, replayed at the fleet's replica count with the deployment's own KV pool as the cache and
the routing the recommendation includes (docs/capacity.md, "The fleet's own cache").

* :func:`deployment_kv_tokens` — the replica's KV pool: the one the deployment states, else
  the model it serves (with its quantisation and KV dtype) on its GPU type and count with
  ``requirements.kv_cache``'s memory figures (vLLM's sizing,
  docs/decision-rules.md#kv-cache-sizing); the GPU's memory from its datasheet.
* :func:`recommended_routing` — the routing the decision's routing rule would include at that
  fleet: the best simulated prefix-aware routing when it saves at least ``ROUTING_GAIN_MIN`` of
  prompt tokens over round-robin at the simulated replica count and cache size nearest the
  fleet's, else round-robin (no routing layer).
* :class:`CacheReplays` — one replay per (replicas, KV pool, routing) through the simulation
  stage's kernels (:func:`pipeline.sim.replay.simulate`: vLLM's prefix-cache rules, request
  lifetimes and routers as configured under ``simulation``), kept and reused by every candidate
  that asks for the same one. A vLLM replica's prefix cache is its KV pool (cached blocks are
  the free ones, reclaimed when running requests need them), so the pool is the cache's size.

The replays run on the flattened workload in memory, or stream a table too large to flatten
through the same kernels a chunk at a time (:class:`pipeline.sim.stream.RequestStream`, each
replay a pass over its parts, keeping 8 bytes a request); over a union of days each streamed
pass is kept at the last day's end and resumed by the next run
(:class:`pipeline.sim.resume.DailyStream`), the only thing written here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pipeline.arrays import Tokens, narrow
from pipeline.capacity.config import ReplicaMemory
from pipeline.capacity.kernels import I64
from pipeline.capacity.limits import SchedulingLimits
from pipeline.capacity.prior import ModelShape, gpu_peaks
from pipeline.errors import InputFormatError
from pipeline.sim.blocks import ContentCoverage, SimInputs, SimulationInputError
from pipeline.sim.config import MAX_REPLICAS, PREFIX_ROUTINGS, Scenario, SimConfig
from pipeline.sim.replay import simulate
from pipeline.sim.result import ScenarioSummary
from pipeline.sim.resume import DailyStream
from pipeline.sim.stream import RequestStream
from pipeline.thresholds import ROUTING_GAIN_MIN
from pipeline.unknown import Unknown

GIB = 2**30

#: Datasheet memory per GPU in GB, by the roofline table's GPU name (its ``source_url``).
GPU_MEMORY_GB: dict[str, float] = {
    "H100 PCIe": 80.0,
    "H100 NVL": 94.0,
    "H100 SXM": 80.0,
    "H200 SXM": 141.0,
    "A100 40GB SXM": 40.0,
    "A100 80GB SXM": 80.0,
    "L40S": 48.0,
    "L4": 24.0,
    "MI300X": 192.0,
    "B200 (HGX B200, per GPU)": 180.0,  # 1,440 GB for eight
}
#: Share of the datasheet memory an engine sees (vLLM on an 80 GB H100 sees 79.2 GiB: the
#: figure docs/decision-rules.md#kv-cache-sizing sizes with).
VISIBLE_MEMORY_SHARE = 0.99
#: The team's configured GPU memory is kept when the deployment's datasheet figure is within
#: this share of it (the same GPU; the team's figure is the one it measured).
SAME_MEMORY_SHARE = 0.03


def deployment_kv_tokens(
    limits: SchedulingLimits,
    shape: ModelShape | None,
    memory: ReplicaMemory | None,
    gpu_type: str,
    gpu_count: int,
    fallback: tuple[int, str],
) -> tuple[int, str]:
    """KV-pool tokens of one replica of this deployment, and where the figure comes from.

    The pool the deployment states (its manifest's or result file's ``kv_cache_tokens``), else
    sized as vLLM does (docs/decision-rules.md#kv-cache-sizing) for the model it serves
    (``shape``: its weights and KV widths, the deployment's quantisation and KV dtype applied)
    on ``gpu_count`` × ``gpu_type`` with ``requirements.kv_cache``'s memory figures: tensor
    parallelism splits the weights and the KV heads over the GPUs (a latent-attention cache is
    kept whole on each), and a GPU of another size has its datasheet memory. Else
    ``fallback``."""
    stated = limits.kv_cache_tokens
    if stated.value is not None:
        tokens = int(stated.value)
        return tokens, f"{tokens:,} tokens: {stated.source}, {stated.detail}"
    if memory is None or shape is None:
        return fallback
    gib, where = memory.gpu_memory_gib, "the GPU memory requirements.kv_cache gives"
    peaks = gpu_peaks(gpu_type)
    datasheet = GPU_MEMORY_GB.get(peaks.name) if not isinstance(peaks, Unknown) else None
    if datasheet is None:
        where += f" ({gpu_type} is not in the GPU memory table)"
    elif abs(datasheet * VISIBLE_MEMORY_SHARE / gib - 1.0) > SAME_MEMORY_SHARE:
        gib = datasheet * VISIBLE_MEMORY_SHARE
        assert not isinstance(peaks, Unknown)
        where = (
            f"{peaks.name}: {datasheet:g} GB × {VISIBLE_MEMORY_SHARE:g} visible, {peaks.source_url}"
        )
    weights = shape.params_billion * 1e9 * shape.weight_bytes / GIB / gpu_count
    budget = gib * memory.memory_utilization - memory.overhead_gib - weights
    if budget <= 0:
        return 0, (
            f"the served model leaves no KV memory on {gpu_count}× {gpu_type} "
            f"({weights:.1f} GiB of weights per GPU; {where})"
        )
    split = 1 if shape.kv_latent_dim is not None else min(gpu_count, shape.kv_heads)
    tokens = math.floor(budget * GIB / (shape.kv_bytes_per_token() / split))
    return tokens, (
        f"{tokens:,} tokens: the served model's weights and KV on {gpu_count}× {gpu_type} "
        f"({where}; requirements.kv_cache's utilisation and overhead)"
    )


def recommended_routing(
    summaries: Sequence[ScenarioSummary], replicas: int, kv_tokens: int, isolated: bool = False
) -> tuple[str, str]:
    """The routing a fleet of ``replicas`` would run, and why (module docstring)."""
    if replicas == 1:
        return "round-robin", "one replica: nothing to route"
    rows = [
        s
        for s in summaries
        if s.replicas > 1
        and s.tenant_isolation == isolated
        and not isinstance(s.hit_tokens, Unknown)
    ]
    if not rows:
        return "round-robin", "no multi-replica scenario with known hits was simulated"
    count = min({s.replicas for s in rows}, key=lambda r: (abs(r - replicas), -r))
    at = [s for s in rows if s.replicas == count]
    size = min(
        sorted({s.cache_tokens for s in at}),
        key=lambda c: abs(math.log(max(c, 1) / max(kv_tokens, 1))),
    )
    hits = {s.routing: float(s.hit_tokens) for s in at if s.cache_tokens == size}  # type: ignore[arg-type]
    prompt = next(s.prompt_tokens for s in at if s.cache_tokens == size)
    where = f"at {count} replicas with {size:,}-token caches, simulated"
    prefix = {r: h for r, h in hits.items() if r in PREFIX_ROUTINGS}
    if "round-robin" not in hits or not prefix or not prompt:
        return "round-robin", f"no round-robin and prefix-aware scenario to compare {where}"
    best = max(sorted(prefix), key=lambda r: prefix[r])
    gain = (prefix[best] - hits["round-robin"]) / prompt
    verdict = f"{best} saves {gain:.1%} of prompt tokens over round-robin {where}"
    if gain >= ROUTING_GAIN_MIN:
        return best, f"{verdict}: the routing layer the decision recommends"
    return "round-robin", f"{verdict}, under {ROUTING_GAIN_MIN:.0%}: no routing layer"


@dataclass(frozen=True)
class CacheReplay:
    """Per-request cached prompt tokens of one replay, in the workload's request order (int32
    where they fit: a replay is kept per fleet size the fixed point tries, each one as long as
    the trace)."""

    replicas: int
    kv_tokens: int
    routing: str
    block_size: int
    cached: Tokens
    share: float  # cached ÷ prompt tokens
    description: str


@dataclass
class CacheReplays:
    """Replays of the workload's prefix cache, one per (replicas, KV pool, routing), on demand.

    ``rows``: the simulation input's row of each of the capacity stage's requests (None: the
    same requests in the same order); their prompt lengths must agree: ``expected_prompt`` (the
    capacity stage's, by input row) is checked against a streamed table's at every replay (a
    flattened one is checked once, by the caller)."""

    inputs: SimInputs | RequestStream | DailyStream
    settings: SimConfig
    summaries: Sequence[ScenarioSummary]
    rows: I64 | None = None
    expected_prompt: Tokens | None = None
    source: str = "the request table"  # what an error names
    _replays: dict[tuple[int, int, str], CacheReplay | Unknown] = field(
        default_factory=dict, repr=False
    )

    @property
    def block_size(self) -> int:
        return min(self.settings.block_sizes)

    def estimate(self, kv_tokens: int) -> float | None:
        """The share of prompt tokens the simulation's own scenarios found cached with caches
        nearest ``kv_tokens``, under the routing a large fleet would run (the largest simulated
        count): where the fixed point starts, before any replay (None: no scenario knows)."""
        counts = [s.replicas for s in self.summaries if not isinstance(s.hit_ratio, Unknown)]
        if not counts:
            return None
        largest = max(counts)
        routing, _ = self.routing(largest, kv_tokens)
        rows = [
            s
            for s in self.summaries
            if s.replicas == largest
            and s.routing == routing
            and s.tenant_isolation == self.settings.tenant_isolation
            and not isinstance(s.hit_ratio, Unknown)
        ]
        if not rows:
            return None
        nearest = min(rows, key=lambda s: abs(math.log(max(s.cache_tokens, 1) / max(kv_tokens, 1))))
        return float(nearest.hit_ratio)  # type: ignore[arg-type]

    def routing(self, replicas: int, kv_tokens: int) -> tuple[str, str]:
        return recommended_routing(
            self.summaries, replicas, kv_tokens, self.settings.tenant_isolation
        )

    def at(self, replicas: int, kv_tokens: int) -> CacheReplay | Unknown:
        """The replay for a fleet of ``replicas`` with ``kv_tokens`` per replica (kept)."""
        routing, why = self.routing(replicas, kv_tokens)
        key = (replicas, kv_tokens, routing)
        if key not in self._replays:
            self._replays[key] = self._replay(replicas, kv_tokens, routing, why)
        return self._replays[key]

    @property
    def replays(self) -> int:
        return len(self._replays)

    def _replay(
        self, replicas: int, kv_tokens: int, routing: str, why: str
    ) -> CacheReplay | Unknown:
        if isinstance(self.inputs, SimInputs):
            reason = self.inputs.coverage().reason
            if reason is not None:
                return Unknown(reason=reason)
        if replicas > MAX_REPLICAS:
            return Unknown(
                reason=f"a fleet of {replicas:,} replicas is more than the replay simulates "
                f"({MAX_REPLICAS:,})"
            )
        scenario = Scenario(
            self.block_size, replicas, kv_tokens, routing, self.settings.tenant_isolation
        )
        try:
            every_hit, every_prompt, coverage = self._hits(scenario)
        except SimulationInputError as exc:
            return Unknown(reason=f"the cache replay cannot run: {exc}")
        if coverage.reason is not None:
            return Unknown(reason=coverage.reason)
        hits = every_hit if self.rows is None else every_hit[self.rows]
        prompt = every_prompt if self.rows is None else every_prompt[self.rows]
        total = int(prompt.sum())
        share = float(hits.sum()) / total if total else 0.0
        partial = (
            f"; the {every_prompt.size - coverage.requests:,} requests without prompt content "
            "count as uncached"
            if coverage.partial
            else ""
        )
        lifetime = self.settings.request_lifetime
        description = (
            f"replay of {prompt.size:,} requests on {replicas} replica(s), {routing} routing "
            f"({why}), a {kv_tokens:,}-token prefix cache per replica (its KV pool), "
            f"{self.block_size}-token blocks, {lifetime} lifetime: {share:.1%} of prompt tokens "
            f"cached{partial}"
        )
        return CacheReplay(
            replicas=replicas,
            kv_tokens=kv_tokens,
            routing=routing,
            block_size=self.block_size,
            cached=narrow(np.ascontiguousarray(hits)),
            share=share,
            description=description,
        )

    def _hits(self, scenario: Scenario) -> tuple[Tokens, Tokens, ContentCoverage]:
        """Every request's hit and prompt tokens of one replay (input order), with the
        table's prompt-content coverage."""
        inp = self.inputs
        if isinstance(inp, SimInputs):
            run = simulate(inp, scenario, self.settings, with_instant=False)
            return run.hit_tokens, inp.prompt_tokens, inp.coverage()
        streamed = inp.simulate(scenario, self.settings, with_instant=False, per_request=True)
        found = streamed.per_request
        assert found is not None  # asked for
        expected = self.expected_prompt
        if expected is not None and not np.array_equal(found.prompt_tokens, expected):
            raise InputFormatError(
                f"{self.source}: the streamed requests differ from the capacity stage's (the "
                "table changed while the stage ran); run the stage again"
            )
        return found.hit_tokens, found.prompt_tokens, found.coverage
