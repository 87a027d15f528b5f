"""The fleet's own cache: the replica's KV pool per deployment, the routing the recommendation
includes, the replays kept per (replicas, KV pool, routing), fleet size and cache iterated to a
fixed point, and how each capacity moves with burstiness, cached share and prefill budget."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache

import numpy as np
import polars as pl
import pytest

from perf.workload import canonical_frame, conversations, spec
from pipeline.capacity.compute import (
    CACHED_SHIFT,
    carry_to_workload,
    fleet_replicas,
    settle_fleet,
)
from pipeline.capacity.fleet_cache import (
    GPU_MEMORY_GB,
    CacheReplay,
    CacheReplays,
    deployment_kv_tokens,
    recommended_routing,
)
from pipeline.capacity.kernels import I64
from pipeline.capacity.limits import SchedulingLimits, resolve_limits
from pipeline.capacity.present import (
    cache_sentence,
    fleet_passes,
    sensitivity_sentence,
    transfer_sentence,
)
from pipeline.capacity.prior import GPU_TABLE
from pipeline.capacity.result import Arrivals, FleetCache, ServingModel
from pipeline.capacity.search import (
    COARSE_BRACKET_RATIO,
    RequestSample,
    sample_requests,
    search_capacity,
)
from pipeline.decision.config import KvCacheSizing
from pipeline.errors import InputFormatError
from pipeline.sim.blocks import NO_CONTENT, sim_input
from pipeline.sim.config import Scenario
from pipeline.sim.replay import simulate
from pipeline.sim.result import ScenarioSummary
from pipeline.sim.stream import RequestStream, frame_chunks
from pipeline.unknown import Unknown
from tests.capacity_scenarios import CONFIG, KV_TOKENS, PRICE, SLO, fitted, workload
from tests.conftest import DEFAULTS

LLAMA_8B_H100 = KvCacheSizing(
    gpu_memory_gib=79.2,
    gpus_per_replica=1,
    memory_utilization=0.92,
    overhead_gib=3,
    model_params_billion=8.03,
    weight_bytes=2,
    layers=32,
    kv_heads=8,
    head_dim=128,
    kv_bytes=2,
)
GIB = 2**30
FALLBACK = (123, "as configured")


def _limits(**manifest: object) -> SchedulingLimits:
    return resolve_limits(
        manifest_args=manifest or None,
        recorded_args={},
        defaults=None,
        config=CONFIG,
        manifest_file="manifest.yaml",
        gpu_count=1,
    )


def test_the_kv_pool_is_the_served_model_on_each_deployments_gpus() -> None:
    served = DEFAULTS.requirements.replace(kv_cache=LLAMA_8B_H100).served_model()
    shape, memory, limits = served.shape, served.memory, _limits()
    # The GPU the team sized for: its own memory figure (79.2 GiB seen of 80 GB), the same
    # tokens requirements.kv_cache gives.
    tokens, source = deployment_kv_tokens(limits, shape, memory, "H100-80GB", 1, FALLBACK)
    assert tokens == LLAMA_8B_H100.tokens_per_replica() == 449_797
    assert "the GPU memory requirements.kv_cache gives" in source
    # Two GPUs: half the weights each, the 8 KV heads split 4 and 4.
    tokens, _ = deployment_kv_tokens(limits, shape, memory, "H100 SXM", 2, FALLBACK)
    budget = 79.2 * 0.92 - 3 - 8.03e9 * 2 / GIB / 2
    assert tokens == math.floor(budget * GIB / (2 * 32 * 4 * 128 * 2))
    # Another GPU: its datasheet memory, 99 % of it visible.
    tokens, source = deployment_kv_tokens(limits, shape, memory, "NVIDIA L40S", 1, FALLBACK)
    budget = 48 * 0.99 * 0.92 - 3 - 8.03e9 * 2 / GIB
    assert tokens == math.floor(budget * GIB / (2 * 32 * 8 * 128 * 2))
    assert "L40S: 48 GB × 0.99 visible, https://www.nvidia.com/en-us/data-center/l40s/" in source
    # The deployment's FP8 KV cache: one byte an element, twice the tokens.
    fp8 = shape.with_quantisation(None, 1.0) if shape is not None else None
    tokens, _ = deployment_kv_tokens(limits, fp8, memory, "H100-80GB", 1, FALLBACK)
    budget = 79.2 * 0.92 - 3 - 8.03e9 * 2 / GIB
    assert tokens == math.floor(budget * GIB / (2 * 32 * 8 * 128 * 1))
    # A GPU the table does not know: the team's figure, said so.
    tokens, source = deployment_kv_tokens(limits, shape, memory, "TPU-v5e", 1, FALLBACK)
    assert tokens == 449_797 and "TPU-v5e is not in the GPU memory table" in source
    # A pool the deployment states is its pool.
    stated = _limits(kv_cache_tokens=300_000)
    tokens, source = deployment_kv_tokens(stated, shape, memory, "H100-80GB", 1, FALLBACK)
    assert (tokens, source) == (300_000, "300,000 tokens: manifest, engine_args in manifest.yaml")
    # No requirements.kv_cache: the caller's figure.
    assert deployment_kv_tokens(limits, shape, None, "H100", 1, FALLBACK) == FALLBACK
    # Weights that leave no room: 0 tokens and why.
    big = shape.model_copy(update={"params_billion": 70.6}) if shape is not None else None
    tokens, source = deployment_kv_tokens(limits, big, memory, "L4", 1, FALLBACK)
    assert tokens == 0
    assert "leaves no KV memory on 1× L4 (131.5 GiB of weights per GPU" in source


def test_every_gpu_of_the_roofline_table_has_its_memory() -> None:
    assert {peaks.name for _, peaks in GPU_TABLE} == set(GPU_MEMORY_GB)


def _summary(
    replicas: int, cache_tokens: int, routing: str, hits: int, isolated: bool = False
) -> ScenarioSummary:
    return ScenarioSummary.model_construct(
        replicas=replicas,
        cache_tokens=cache_tokens,
        routing=routing,
        hit_tokens=hits,
        prompt_tokens=1000,
        tenant_isolation=isolated,
    )


def test_the_routing_is_the_one_the_recommendation_includes() -> None:
    grid = [
        _summary(r, c, routing, hits)
        for r in (4, 16)
        for c in (1_000_000, 4_000_000)
        for routing, hits in (("round-robin", 100), ("cache-aware", 250), ("affinity", 220))
    ]
    assert recommended_routing(grid, 1, 450_000) == (
        "round-robin",
        "one replica: nothing to route",
    )
    routing, why = recommended_routing(grid, 5, 450_000)
    assert routing == "cache-aware"
    assert why == (
        "cache-aware saves 15.0% of prompt tokens over round-robin at 4 replicas with "
        "1,000,000-token caches, simulated: the routing layer the decision recommends"
    )
    small_gain = [
        _summary(4, 1_000_000, "round-robin", 100),
        _summary(4, 1_000_000, "affinity", 150),
    ]
    routing, why = recommended_routing(small_gain, 9, 450_000)
    assert routing == "round-robin" and why.endswith("under 10%: no routing layer")
    no_baseline = [_summary(4, 1_000_000, "affinity", 150)]
    routing, why = recommended_routing(no_baseline, 9, 450_000)
    assert routing == "round-robin" and why.startswith("no round-robin and prefix-aware scenario")
    isolated_only = [_summary(4, 1_000_000, "affinity", 900, isolated=True)]
    assert recommended_routing(isolated_only, 9, 450_000)[1] == (
        "no multi-replica scenario with known hits was simulated"
    )


@dataclass
class FakeCache:
    """Cached tokens of ``share(replicas)`` of every prompt, which counts were asked, and
    ``start`` as the simulated scenarios' share."""

    prompt: I64
    share: Callable[[int], float]
    start: float | None = None
    asked: list[int] = field(default_factory=list)
    routed: Callable[[int], str] = lambda replicas: "round-robin"

    def estimate(self, kv_tokens: int) -> float | None:
        return self.start

    def routing(self, replicas: int, kv_tokens: int) -> tuple[str, str]:
        return self.routed(replicas), "test"

    def at(self, replicas: int, kv_tokens: int) -> CacheReplay | Unknown:
        self.asked.append(replicas)
        share = self.share(replicas)
        cached = np.floor(self.prompt * share).astype(np.int64)
        routing = self.routed(replicas)
        return CacheReplay(replicas, kv_tokens, routing, 16, cached, share, f"at {replicas}")


@cache
def _long() -> tuple[ServingModel, RequestSample]:
    model = fitted("short")
    assert isinstance(model, ServingModel)
    mix = workload("long")
    return model, sample_requests(mix.prompt, mix.output, mix.cached, CONFIG)


def _capacity(sample: RequestSample, cached: I64) -> float:
    model, _ = _long()
    found = search_capacity(
        model.coefficients,
        sample.with_workload_cached(cached),
        SLO,
        limits=model.limits,
        kv_tokens=KV_TOKENS,
        config=CONFIG,
    )
    assert not isinstance(found, Unknown)
    return found.rate_rps


def test_fleet_size_and_cache_settle_from_the_simulated_share() -> None:
    model, sample = _long()
    prompt = workload("long").prompt
    source = FakeCache(prompt, lambda replicas: 0.6 / math.sqrt(replicas), start=0.6)
    settled = settle_fleet(
        model.coefficients,
        sample,
        SLO,
        limits=model.limits,
        kv_tokens=KV_TOKENS,
        kv_source="test",
        peak_rate_rps=40.0,
        config=CONFIG,
        cache=source,
    )
    record = settled.record
    assert isinstance(record, FleetCache) and record.settled
    start, *passes = record.steps
    # The start: no replay, every prompt at the simulated scenarios' share.
    assert (start.replicas, start.cached_share) == (0, 0.6)
    assert isinstance(start.capacity_rps, float)
    assert start.capacity_rps == pytest.approx(
        _capacity(sample, np.floor(prompt * 0.6).astype(np.int64)), rel=0.04
    )
    assert source.asked[0] == start.replicas_needed
    # Each pass: the replay at its count, the capacity with each request's cached tokens, the
    # count that capacity needs; the last pass needs its own count.
    for step in passes:
        cached = np.floor(prompt * 0.6 / math.sqrt(step.replicas)).astype(np.int64)
        assert isinstance(step.capacity_rps, float)
        assert step.capacity_rps == pytest.approx(_capacity(sample, cached), rel=0.04)
        assert step.replicas_needed == fleet_replicas(step.capacity_rps, 40.0, CONFIG)
    steps = record.steps
    assert [s.replicas for s in steps[1:]] == [s.replicas_needed for s in steps[:-1]]
    assert steps[-1].replicas_needed == steps[-1].replicas == record.replicas
    assert record.cached_share == pytest.approx(0.6 / math.sqrt(record.replicas))
    # The kept pass is searched to 1 %: its capacity sizes the fleet it was replayed at.
    assert not isinstance(settled.found, Unknown)
    assert fleet_replicas(settled.found.rate_rps, 40.0, CONFIG) == record.replicas
    assert settled.cached is not None and sample.index is not None
    expected = np.minimum(settled.cached[sample.index], sample.prompt - 1)
    assert np.array_equal(settled.sample.cached, expected)
    # No simulated share to start from: the start is uncached, the answer the same.
    cold_start = settle_fleet(
        model.coefficients,
        sample,
        SLO,
        limits=model.limits,
        kv_tokens=KV_TOKENS,
        kv_source="test",
        peak_rate_rps=40.0,
        config=CONFIG,
        cache=FakeCache(prompt, lambda replicas: 0.6 / math.sqrt(replicas)),
    ).record
    assert isinstance(cold_start, FleetCache) and cold_start.steps[0].cached_share == 0.0
    assert cold_start.replicas == record.replicas


def test_a_count_within_the_tolerance_settles_without_another_replay() -> None:
    model, sample = _long()
    prompt = workload("long").prompt
    # The start at 60 % cached, every replay 59 %: the start's capacity (a 3 % search, as the
    # fixed point runs it) and the replay's are worked out here, and the peak set so that the
    # start sizes 30 replicas and the replay's capacity needs 31, within 5 % of 30.
    start = search_capacity(
        model.coefficients,
        sample.with_cached(np.floor(sample.prompt * 0.6).astype(np.int64)),
        SLO,
        limits=model.limits,
        kv_tokens=KV_TOKENS,
        config=CONFIG,
        bracket=COARSE_BRACKET_RATIO,
    )
    assert not isinstance(start, Unknown)
    replay = search_capacity(
        model.coefficients,
        sample.with_workload_cached(np.floor(prompt * 0.59).astype(np.int64)),
        SLO,
        limits=model.limits,
        kv_tokens=KV_TOKENS,
        config=CONFIG,
        near=start.rate_rps,
        bracket=COARSE_BRACKET_RATIO,
    )
    assert not isinstance(replay, Unknown) and replay.rate_rps < start.rate_rps
    spare = 1 if CONFIG.n_plus_one else 0
    peak = (30 - spare) * start.rate_rps * CONFIG.headroom * 0.9999
    assert fleet_replicas(start.rate_rps, peak, CONFIG) == 30
    assert fleet_replicas(replay.rate_rps, peak, CONFIG) == 31

    def settle(source: FakeCache) -> FleetCache:
        record = settle_fleet(
            model.coefficients,
            sample,
            SLO,
            limits=model.limits,
            kv_tokens=KV_TOKENS,
            kv_source="test",
            peak_rate_rps=peak,
            config=CONFIG,
            cache=source,
        ).record
        assert isinstance(record, FleetCache)
        return record

    source = FakeCache(prompt, lambda replicas: 0.59, start=0.6)
    record = settle(source)
    assert source.asked == [30] and record.settled
    assert [(s.replicas, s.replicas_needed) for s in record.steps] == [(0, 30), (30, 31)]
    assert "settled within 5% of the count (the pass at 30 needs 31, the same routing" in (
        fleet_passes(record)
    )
    # Another routing at 31: that fleet's cache is not the one replayed, so it is replayed.
    source = FakeCache(
        prompt,
        lambda replicas: 0.59,
        start=0.6,
        routed=lambda replicas: "cache-aware" if replicas > 30 else "round-robin",
    )
    record = settle(source)
    assert source.asked == [30, 31] and record.settled
    assert record.replicas == 31 and record.routing == "cache-aware"
    assert fleet_passes(record).startswith("Fleet and cache settled: ")


def test_an_alternating_fleet_keeps_the_costlier_pass_and_says_so() -> None:
    model, sample = _long()
    prompt = workload("long").prompt
    high = _capacity(sample, np.floor(prompt * 0.6).astype(np.int64))
    # The peak makes the warm cache's capacity need 3; the cache at 3 is cold (a routing that
    # scatters prefixes there), its capacity needs more, and the cache at that count is warm
    # again: 3 and the larger count alternate.
    peak = 2.5 * CONFIG.headroom * high
    source = FakeCache(prompt, lambda replicas: 0.0 if replicas == 3 else 0.6, start=0.6)
    settled = settle_fleet(
        model.coefficients,
        sample,
        SLO,
        limits=model.limits,
        kv_tokens=KV_TOKENS,
        kv_source="test",
        peak_rate_rps=peak,
        config=CONFIG,
        cache=source,
    )
    record = settled.record
    assert isinstance(record, FleetCache) and not record.settled
    first, cold, warm = record.steps
    assert (first.replicas, first.replicas_needed) == (0, 3)
    assert cold.replicas == 3 and cold.replicas_needed is not None and cold.replicas_needed > 3
    assert warm.replicas == cold.replicas_needed and warm.replicas_needed == 3
    # The pass needing the most replicas stands: the cold cache at 3.
    assert record.replicas == 3 and record.cached_share == 0.0
    assert not isinstance(settled.found, Unknown)
    assert fleet_replicas(settled.found.rate_rps, peak, CONFIG) == cold.replicas_needed
    assert "did not settle (the count alternated)" in fleet_passes(record)


def test_no_replay_means_the_workloads_own_cached_tokens() -> None:
    model, sample = _long()

    class NoContent:
        def at(self, replicas: int, kv_tokens: int) -> CacheReplay | Unknown:
            return Unknown(reason=NO_CONTENT)

        def estimate(self, kv_tokens: int) -> float | None:
            return None

        def routing(self, replicas: int, kv_tokens: int) -> tuple[str, str]:
            return "round-robin", "no replay"

    settled = settle_fleet(
        model.coefficients,
        sample,
        SLO,
        limits=model.limits,
        kv_tokens=KV_TOKENS,
        kv_source="test",
        peak_rate_rps=40.0,
        config=CONFIG,
        cache=NoContent(),
    )
    assert settled.record == Unknown(reason=NO_CONTENT)
    assert settled.cached is None and settled.sample is sample


@cache
def _replays() -> CacheReplays:
    frame = canonical_frame(conversations(spec(3000, "short", rate_rps=5.0)), 16)
    inputs = sim_input(frame, latency_model=DEFAULTS.shape.latency)
    return CacheReplays(inputs, DEFAULTS.simulation.replace(block_sizes=[16]), [])


def test_replays_are_kept_per_replicas_pool_and_routing_and_match_the_simulation() -> None:
    replays = _replays()
    one = replays.at(1, 20_000)
    assert isinstance(one, CacheReplay)
    assert replays.at(1, 20_000) is one and replays.replays == 1
    two = replays.at(2, 20_000)
    assert isinstance(two, CacheReplay) and replays.replays == 2
    scenario = Scenario(16, 2, 20_000, "round-robin")
    inputs = replays.inputs
    hits = simulate(inputs, scenario, replays.settings, with_instant=False).hit_tokens
    assert np.array_equal(two.cached, hits)
    assert two.share == pytest.approx(hits.sum() / inputs.prompt_tokens.sum())
    assert two.description.startswith(
        "replay of 3,000 requests on 2 replica(s), round-robin routing (no multi-replica scenario "
        "with known hits was simulated), a 20,000-token prefix cache per replica (its KV pool), "
        "16-token blocks, durations lifetime: "
    )
    # A bigger pool holds more of the shared prefixes.
    big = replays.at(2, 2_000_000)
    assert isinstance(big, CacheReplay) and big.share > two.share
    # The capacity stage's requests may be a subset: each gets its own row's hits.
    rows = np.arange(0, inputs.n, 3, dtype=np.int64)
    subset = CacheReplays(inputs, replays.settings, [], rows).at(2, 20_000)
    assert isinstance(subset, CacheReplay) and np.array_equal(subset.cached, hits[rows])


def test_a_streamed_table_replays_the_fleet_as_the_flattened_one_does() -> None:
    """A table too large to flatten replays the fleet chunk by chunk: the same cached tokens,
    share and description; a table that changed under the stage is the one-line error."""
    flat = _replays()
    frame = canonical_frame(conversations(spec(3000, "short", rate_rps=5.0)), 16)
    stream = RequestStream(frame_chunks(frame, 700), DEFAULTS.shape.latency, max_rows=250)
    rows = np.arange(1, flat.inputs.n, 2, dtype=np.int64)
    prompt = frame["prompt_tokens"].to_numpy().astype(np.int64)
    streamed = CacheReplays(stream, flat.settings, [], rows, expected_prompt=prompt)
    for replicas, pool in ((1, 20_000), (2, 20_000), (2, 2_000_000)):
        want = CacheReplays(flat.inputs, flat.settings, [], rows).at(replicas, pool)
        got = streamed.at(replicas, pool)
        assert isinstance(got, CacheReplay) and isinstance(want, CacheReplay)
        assert np.array_equal(got.cached, want.cached) and got.cached.sum() > 0
        assert replace(got, cached=want.cached) == replace(want, cached=want.cached)
    changed = CacheReplays(
        stream, flat.settings, [], rows, expected_prompt=prompt + 1, source="requests/"
    )
    with pytest.raises(InputFormatError, match=r"^requests/: the streamed requests differ"):
        changed.at(2, 20_000)


def test_a_trace_without_content_has_no_replay() -> None:
    frame = canonical_frame(conversations(spec(200, "short")), None)
    inputs = sim_input(
        frame.with_columns(
            pl.lit(16).alias("block_size"),
            pl.lit([], pl.List(pl.UInt64)).alias("prefix_hashes"),
            pl.lit(0).alias("prompt_blocks"),
        ),
        latency_model=DEFAULTS.shape.latency,
    )
    assert CacheReplays(inputs, DEFAULTS.simulation, []).at(2, 20_000) == Unknown(reason=NO_CONTENT)


def test_carried_with_the_fleets_cache_and_what_moves_it() -> None:
    model = fitted("short")
    assert isinstance(model, ServingModel)
    mix = workload("long")
    prompt = mix.prompt
    source = FakeCache(prompt, lambda replicas: 0.5 if replicas == 1 else 0.3)
    candidate = carry_to_workload(
        "vllm",
        model,
        mix,
        SLO,
        kv_tokens=KV_TOKENS,
        kv_source="the team's",
        gpu_hour_usd=PRICE,
        peak_rate_rps=30.0,
        mean_rate_rps=10.0,
        config=CONFIG,
        fleet_cache=source,
    )
    fleet = candidate.fleet_cache
    assert isinstance(fleet, FleetCache) and fleet.settled
    assert fleet.cached_share == 0.3 and fleet.kv_source == "the team's"
    assert not isinstance(candidate.cost, Unknown) and candidate.cost.replicas == fleet.replicas
    # The transfer and the prices see the fleet's cached tokens, not the workload's own (none).
    assert not isinstance(candidate.transfer, Unknown)
    assert "30% of its prompt tokens cached" in candidate.transfer.description
    capacity = candidate.workload_capacity_rps
    assert isinstance(capacity, float)
    # Sensitivity: Poisson arrivals here are the search's own; more cached tokens, more capacity;
    # a smaller prefill budget, less (these prompts already take several 1,024-token chunks).
    moved = {v.key: v for v in candidate.sensitivity}
    assert moved["poisson"].capacity_rps == capacity and moved["poisson"].change == 0.0
    assert moved["poisson"].description == "Poisson arrivals (CV 1): the search's own"
    minus, plus = moved["cached_minus"], moved["cached_plus"]
    assert isinstance(minus.capacity_rps, float) and isinstance(plus.capacity_rps, float)
    assert minus.capacity_rps < capacity < plus.capacity_rps
    assert minus.description == (
        f"cached share 10% (−{CACHED_SHIFT * 100:.0f} points of each prompt, from 30%)"
    )
    assert plus.change == pytest.approx(plus.capacity_rps / capacity - 1)
    assert moved["budget_half"].description == "prefill budget 512 tokens a step (half 1,024)"
    assert moved["budget_double"].description == "prefill budget 2,048 tokens a step (double 1,024)"
    assert isinstance(moved["budget_half"].capacity_rps, float)
    assert moved["budget_half"].capacity_rps < capacity
    text = sensitivity_sentence(candidate)
    assert text.startswith(f"Poisson arrivals (CV 1): the search's own: {capacity:.3g} req/s (+0%)")
    assert cache_sentence(candidate).startswith(f"Cached tokens: at {fleet.replicas}. Fleet and")
    # Poisson arrivals: nothing about bursts in the sentence a VP reads.
    assert "bursts" not in transfer_sentence(candidate)
    bursty = candidate.model_copy(
        update={
            "arrivals": Arrivals(kind="trace", cv=2.0, description="its own"),
            "sensitivity": [
                moved["poisson"].model_copy(update={"capacity_rps": 2 * capacity, "change": 1.0})
            ],
        }
    )
    assert f"with the traffic's bursts (Poisson arrivals: {2 * capacity:.3g}, +100%)" in (
        transfer_sentence(bursty)
    )


def test_a_pool_that_holds_nothing_is_unknown_with_the_reason() -> None:
    model = fitted("short")
    assert isinstance(model, ServingModel)
    candidate = carry_to_workload(
        "vllm",
        model,
        workload("long"),
        SLO,
        kv_tokens=0,
        kv_source="requirements.kv_cache's model leaves no KV memory on 1× L4",
        gpu_hour_usd=PRICE,
        peak_rate_rps=30.0,
        mean_rate_rps=10.0,
        config=CONFIG,
    )
    assert candidate.workload_capacity_rps == Unknown(
        reason="no KV cache: requirements.kv_cache's model leaves no KV memory on 1× L4"
    )
    assert candidate.sensitivity == []
