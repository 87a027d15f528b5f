"""The ``simulation`` section of ``enginefit.yaml``: the scenario grid and the router knobs
(defaults and their documentation: ``pipeline/defaults.yaml``)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, Strict, ValidationError

from pipeline.errors import ConfigError
from pipeline.settings import (
    BlockSize,
    Fraction,
    Section,
    Seed,
    between,
    collected,
    validation_message,
)
from pipeline.shape.config import LatencyModelConfig
from pipeline.shape.facts import LatencyModel

Routing = Literal[
    "round-robin",
    "random",
    "least-loaded",
    "least-served",
    "affinity",
    "bounded-affinity",
    "cache-aware",
]
ROUTINGS: tuple[str, ...] = get_args(Routing)
# Routings whose assignment never looks at cache state, so one stack-distance pass gives the
# hit ratio at every capacity (pipeline.sim.curve).
CACHE_INDEPENDENT: frozenset[str] = frozenset(ROUTINGS) - {"cache-aware"}
# Routings that send a request where its prefix is (the ones a prefix-aware layer adds).
PREFIX_ROUTINGS: tuple[str, ...] = ("cache-aware", "affinity", "bounded-affinity")


# sgl-router ``cache_aware`` defaults come in inconsistent layers:
# ``library`` is the Rust ``CacheAwareConfig::default`` of sglang-router 0.3.2
# (``src/policies/mod.rs`` L93-110, also smg ``f8daa88`` ``model_gateway/src/policies/mod.rs``
# L180-185); ``launcher`` is what the router's CLI (``src/main.rs`` L149-171) and Python launcher
# (``router_args.py`` L28-37) start with. Values: cache_threshold, balance_abs_threshold,
# balance_rel_threshold.
CACHE_AWARE_PRESETS: dict[str, tuple[float, int, float]] = {
    "library": (0.5, 32, 1.1),
    "launcher": (0.3, 64, 1.5),
}

RequestLifetime = Literal["durations", "instant"]
REQUEST_LIFETIMES: tuple[str, ...] = get_args(RequestLifetime)

# What one scenario may ask for, checked alike for the configured grid and the command line's
# flags before any kernel allocates (the kernels' own guards are the last line of defence).
# Replicas: every replica gets its rows in the outputs, the load-reading routings scan every
# replica per request (O(requests × replicas)) and cache-aware routing holds every replica's
# block state at once (also bounded by bytes: replay.MAX_ROUTED_STATE_BYTES); 4096 is far past
# one router pool serving one model.
MAX_REPLICAS = 4096
# Cache tokens per replica: a petatoken is about a billion H100s' KV caches, and capacity ×
# block size stays inside int64.
MAX_CACHE_TOKENS = 10**15
# Requests in flight (replica_slots, balance_abs_threshold): the kernels count them in int64,
# and no replica runs 2^31 requests at once.
MAX_IN_FLIGHT = 2**31 - 1
# A client's timeout (request_timeout_s): a millisecond to a year, whose microseconds stay far
# inside the kernels' durations (below 2^61 µs).
MIN_REQUEST_TIMEOUT_S = 0.001
MAX_REQUEST_TIMEOUT_S = 365 * 86_400.0
RequestTimeout = Annotated[float, between(MIN_REQUEST_TIMEOUT_S, MAX_REQUEST_TIMEOUT_S)]
# Log-spaced curve points printed and written to curves.json (curves.parquet has every step).
MAX_CURVE_POINTS = 10_000
# SHARDS sampling rate: below one block in a million the sample of any trace is too thin to
# estimate a curve (and below 2^-64 the sampling threshold underflows).
MIN_SAMPLE_RATE = 1e-6
# Stored blocks (the hashes of every request's chain, counted from the request parts' Parquet
# metadata) up to which the capacity curves are exact; past it they come from a SHARDS sample
# of ``curve_sample_rate`` taken while the table is read part by part (pipeline.sim.curve_stream).
# At most 2^40 (8 TiB of hashes): no machine holds an exact pass that large.
MAX_CURVE_EXACT_BLOCKS = 2**40
# bounded-affinity spills past (1 + margin) x its share: at 100 the home replica takes 101x its
# share before spilling, which is plain affinity.
MAX_AFFINITY_MARGIN = 100.0
AffinityMargin = Annotated[float, between(0, MAX_AFFINITY_MARGIN)]
# sgl-router's balance_rel_threshold (1.1 or 1.5 by default): past 1000 it never balances.
MAX_BALANCE_REL_THRESHOLD = 1_000.0


def _at_most(limit: int, what: str, why: str) -> AfterValidator:
    def check(value: int) -> int:
        if value > limit:
            raise ValueError(f"at most {limit:,} {what} ({why})")
        return value

    return AfterValidator(check)


ReplicaCount = Annotated[
    int,
    Field(gt=0),
    _at_most(
        MAX_REPLICAS,
        "replicas",
        "per-replica outputs and routing work grow with the count; MAX_REPLICAS in "
        "pipeline/sim/config.py",
    ),
]
CacheTokens = Annotated[
    int,
    Field(ge=0),
    _at_most(MAX_CACHE_TOKENS, "cache tokens per replica", "MAX_CACHE_TOKENS"),
]
InFlight = Annotated[int, Field(ge=0, le=MAX_IN_FLIGHT)]
CurvePoints = Annotated[int, Field(ge=2, le=MAX_CURVE_POINTS)]
SampleRate = Annotated[float, Field(ge=MIN_SAMPLE_RATE, le=1)]
CurveBlocks = Annotated[
    int,
    Field(ge=0),
    _at_most(
        MAX_CURVE_EXACT_BLOCKS,
        "stored blocks",
        "an exact pass holds about 50 bytes a block; MAX_CURVE_EXACT_BLOCKS in "
        "pipeline/sim/config.py",
    ),
]


@dataclass(frozen=True)
class CacheAwareConfig:
    """sgl-router ``cache_aware`` parameters: a preset's values, some perhaps overridden.

    ``preset`` names the preset the values started from; ``overridden`` lists the keys set
    explicitly on top of it (see :meth:`from_preset`).
    """

    cache_threshold: float
    balance_abs_threshold: int
    balance_rel_threshold: float
    preset: str
    overridden: tuple[str, ...] = ()

    @classmethod
    def from_preset(cls, preset: str, **overrides: Any) -> CacheAwareConfig:
        """The preset's values, with any of the three parameters overridden."""
        if preset not in CACHE_AWARE_PRESETS:
            raise ValueError(f"unknown cache_aware preset {preset!r}")
        threshold, abs_thr, rel_thr = CACHE_AWARE_PRESETS[preset]
        values: dict[str, Any] = {
            "cache_threshold": threshold,
            "balance_abs_threshold": abs_thr,
            "balance_rel_threshold": rel_thr,
        }
        unknown = sorted(set(overrides) - set(values))
        if unknown:
            raise ValueError(f"unknown cache_aware keys {unknown}")
        values.update(overrides)
        return cls(**values, preset=preset, overridden=tuple(sorted(overrides)))

    def as_dict(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "overridden": list(self.overridden),
            "cache_threshold": self.cache_threshold,
            "balance_abs_threshold": self.balance_abs_threshold,
            "balance_rel_threshold": self.balance_rel_threshold,
        }


@dataclass(frozen=True)
class Scenario:
    """One replay: block size × replicas × cache capacity per replica × routing."""

    block_size: int
    replicas: int
    cache_tokens: int
    routing: str
    tenant_isolation: bool = False

    @property
    def key(self) -> str:
        """A stable identifier (letters, digits, underscores) usable as a Dagster mapping key."""
        iso = "_iso" if self.tenant_isolation else ""
        route = self.routing.replace("-", "_")
        return f"b{self.block_size}_r{self.replicas}_c{self.cache_tokens}_{route}{iso}"


def _cache_aware(value: Any) -> Any:
    """``{preset, cache_threshold?, balance_abs_threshold?, balance_rel_threshold?}``."""
    if isinstance(value, CacheAwareConfig):
        return value
    if not isinstance(value, dict):
        raise ConfigError("simulation.cache_aware: must be a mapping with a preset")
    raw = dict(value)
    preset = raw.pop("preset", None)
    if preset not in CACHE_AWARE_PRESETS:
        raise ConfigError(
            f"simulation.cache_aware.preset: must be one of {list(CACHE_AWARE_PRESETS)}, "
            f"got {preset!r}"
        )
    try:
        overrides = _CacheAwareOverrides.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(
            validation_message(exc, _CacheAwareOverrides, "simulation.cache_aware")
        ) from exc
    return CacheAwareConfig.from_preset(preset, **overrides.model_dump(exclude_none=True))


class _CacheAwareOverrides(Section):
    cache_threshold: Fraction | None = None
    balance_abs_threshold: InFlight | None = None
    balance_rel_threshold: Annotated[float, between(1, MAX_BALANCE_REL_THRESHOLD)] | None = None


class SimConfig(Section):
    """The scenario grid and the replay's knobs (every key documented in defaults.yaml)."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=True, allow_inf_nan=False, arbitrary_types_allowed=True
    )

    block_sizes: Annotated[tuple[BlockSize, ...], Strict(False), Field(min_length=1)]
    replicas: Annotated[tuple[ReplicaCount, ...], Strict(False), Field(min_length=1)]
    cache_tokens: Annotated[tuple[CacheTokens, ...], Strict(False), Field(min_length=1)]
    routings: Annotated[tuple[Routing, ...], Strict(False), Field(min_length=1)]
    bounded_affinity_margin: AffinityMargin
    random_seed: Seed
    tenant_isolation: bool
    compare_isolation: bool
    cache_aware: Annotated[CacheAwareConfig, BeforeValidator(collected(_cache_aware))]
    request_lifetime: RequestLifetime
    replica_slots: Annotated[InFlight, Field(gt=0)] | None
    request_timeout_s: RequestTimeout | None
    latency_model: LatencyModelConfig | None
    curve_exact_max_blocks: CurveBlocks
    curve_sample_rate: Annotated[SampleRate, Field(lt=1)] | None

    def latency(self, fallback: LatencyModel) -> LatencyModel:
        """The latency model durations come from: this section's, else ``fallback`` (the
        shape section's)."""
        return self.latency_model.as_model() if self.latency_model is not None else fallback

    def timeout_us(self, lifetime: str) -> int:
        """The replay kernels' ``timeout`` for ``lifetime``: ``request_timeout_s`` in µs under
        the durations lifetime, 0 (nothing shed) under the instant one or without a timeout."""
        if lifetime != "durations" or self.request_timeout_s is None:
            return 0
        return round(self.request_timeout_s * 1_000_000)

    def scenarios(self) -> list[Scenario]:
        """The grid, in a fixed order; replicas=1 runs only one routing (they are all equal).
        With ``compare_isolation`` every scenario runs with a shared cache and again with one
        namespace per tenant."""
        isolation = (False, True) if self.compare_isolation else (self.tenant_isolation,)
        out: list[Scenario] = []
        for bs, reps, cap, routing, isolated in itertools.product(
            self.block_sizes, self.replicas, self.cache_tokens, self.routings, isolation
        ):
            if reps == 1 and routing != self.routings[0]:
                continue
            out.append(Scenario(bs, reps, cap, routing, isolated))
        return out


class ScenarioFlags(Section):
    """One ad-hoc scenario or curve as typed on the command line: each value is text parsed
    here (so ``nan`` or ``1.5`` for a count is refused like ``-5``), then held to the same
    bounds as the configured grid."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, allow_inf_nan=False)

    block_size: BlockSize
    replicas: ReplicaCount
    routing: Routing
    cache_tokens: CacheTokens | None = None
    points: CurvePoints | None = None
    sample_rate: SampleRate | None = None
    random_seed: Seed | None = None
    bounded_affinity_margin: AffinityMargin | None = None
