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
``far_ratio``
    A workload whose mean prompt or output is more than this factor away from the benchmark's
    (or outside the lengths it measured) makes the transfer provisional.
``min_band_spread``
    The capacity band is never narrower than ± this share (a fit with tiny residuals on one mix
    still extrapolates).
"""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import Field, model_validator

from pipeline.settings import PositiveInt, Section


class CapacityConfig(Section):
    """Validated capacity settings (every key documented in defaults.yaml)."""

    headroom: Annotated[float, Field(gt=0, le=1)]
    n_plus_one: bool
    sample_requests: Annotated[int, Field(ge=200, le=1_000_000)]
    seed: Annotated[int, Field(ge=0)]
    warmup_share: Annotated[float, Field(ge=0, lt=0.5)]
    token_budget: PositiveInt | None = None
    max_batch: PositiveInt | None = None
    chunked_prefill: bool | None = None
    far_ratio: Annotated[float, Field(gt=1)]
    min_band_spread: Annotated[float, Field(ge=0, lt=0.5)]

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
