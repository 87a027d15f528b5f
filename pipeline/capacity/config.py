"""The ``capacity`` section of ``enginefit.yaml``: how the serving model is carried to the
workload and the fleet sized (defaults and their documentation: ``pipeline/defaults.yaml``).

``headroom``
    Utilisation of a replica's SLO capacity the fleet is sized to at the workload's peak (0.8:
    a replica runs at most at 80 % of the rate where its p95 TTFT would reach the limit).
``n_plus_one``
    One more replica than the peak needs, so the fleet survives losing one.
``sample_requests`` / ``seed``
    The capacity search simulates this many requests drawn from the workload (with this seed):
    a few thousand keep the tail percentiles stable and the search well under a second.
``warmup_share``
    The first share of simulated requests is left out of the percentiles (they meet an empty
    server; warm-up requests discarded, docs/decision-rules.md#transferability).
``token_budget`` / ``max_batch`` / ``chunked_prefill``
    The team's override of every deployment's per-step token budget (vLLM
    ``max_num_batched_tokens``), running-request limit (``max_num_seqs``) and chunked prefill.
    Null (the default): each deployment's own, from its manifest's ``engine_args``, its result
    file, the engine catalog's defaults or the data (``pipeline.capacity.limits``).
``min_band_spread``
    The capacity band is never narrower than ± this share (a fit with tiny residuals on one mix
    still extrapolates).
``validation_error``
    The error of a transferred capacity the project has measured (model ÷ measured − 1 within
    ± this share): combined with the fit's residuals into the capacity band of every
    transferred capacity; a capacity measured on the workload's own traffic has only its
    residuals (docs/capacity.md, "The band").
``arrivals`` / ``arrival_cv`` / ``arrival_windows``
    How the sampled requests arrive in the search: ``trace`` replays the workload's own
    inter-arrival pattern (``arrival_windows`` contiguous runs of requests, each scaled to the
    rate tried), falling back to Gamma gaps at the measured CV when the timestamps cannot resolve
    gaps; ``gamma`` draws Gamma gaps at ``arrival_cv`` (null: the measured CV); ``poisson``
    exponential gaps. The Poisson figure is always computed beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from pipeline.capacity.prior import ModelShape
from pipeline.settings import Section, Seed, between
from pipeline.shape.facts import LatencyModel
from pipeline.sim.config import SimConfig

# A fleet sized to run its replicas below this share of their SLO capacity is over 20x
# over-provisioned: a typo, and near zero the replica count overflows.
MIN_HEADROOM = 0.05
# The engine's per-step token budget and running-request limit: vLLM's defaults are 8,192 (or
# 2,048) and 256 (or 1,024); a million tokens a step or 65,536 requests at once runs on no GPU.
MAX_TOKEN_BUDGET = 2**20
MAX_BATCH = 2**16


@dataclass(frozen=True)
class ReplicaMemory:
    """The GPU memory ``requirements.kv_cache`` sizes a replica's KV pool from: the GPU's
    memory the engine sees, the share it may use and the engine's overhead (the model's shape
    and the deployment's GPU count give the rest)."""

    gpu_memory_gib: float
    memory_utilization: float
    overhead_gib: float


@dataclass(frozen=True)
class ServedModel:
    """What the team says of the model it serves (``requirements.models`` and
    ``requirements.kv_cache``), as the capacity stage takes it: the models' names, the KV-cache
    tokens one replica holds, the model's shape for the roofline prior and the GPU memory the
    KV pool is sized from per deployment (None: not given)."""

    models: tuple[str, ...] = ()
    kv_tokens: int | None = None
    shape: ModelShape | None = None
    memory: ReplicaMemory | None = None


@dataclass(frozen=True)
class ReplayBasis:
    """How the fleet's own cache is replayed: the ``simulation`` section (vLLM's prefix-cache
    rules, the request lifetime, the routers, the block sizes, tenant isolation) and the
    latency model request durations come from (``simulation.latency_model``, else the shape
    section's, ``fallback``)."""

    simulation: SimConfig
    fallback: LatencyModel

    @property
    def latency(self) -> LatencyModel:
        return self.simulation.latency(self.fallback)


class CapacityConfig(Section):
    """Validated capacity settings (every key documented in defaults.yaml)."""

    headroom: Annotated[float, between(MIN_HEADROOM, 1)]
    n_plus_one: bool
    sample_requests: Annotated[int, Field(ge=200, le=1_000_000)]
    seed: Seed
    warmup_share: Annotated[float, Field(ge=0, lt=0.5)]
    token_budget: Annotated[int, between(1, MAX_TOKEN_BUDGET)] | None = None
    max_batch: Annotated[int, between(1, MAX_BATCH)] | None = None
    chunked_prefill: bool | None = None
    min_band_spread: Annotated[float, Field(ge=0, lt=0.5)]
    validation_error: Annotated[float, Field(ge=0, lt=0.9)]
    # Defaults here too: a capacity document written before these keys keeps its settings
    # readable (the decision re-validates them from the document).
    arrivals: Literal["trace", "gamma", "poisson"] = "trace"
    arrival_cv: Annotated[float, Field(gt=0, le=20)] | None = None
    arrival_windows: Annotated[int, Field(ge=1, le=1000)] = 8

    @model_validator(mode="after")
    def _batch_within_budget(self) -> Self:
        if (
            self.max_batch is not None
            and self.token_budget is not None
            and self.max_batch > self.token_budget
        ):
            raise ValueError(
                f"max_batch ({self.max_batch}) must not exceed token_budget "
                f"({self.token_budget}): every running request decodes one token a step"
            )
        return self
