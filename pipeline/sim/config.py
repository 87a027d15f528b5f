"""The ``simulation`` configuration section: the scenario grid and the router parameters.

Every option has a default, so an absent section still gives a small, fast grid. Values are
validated here and errors name the offending key.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import ConfigError
from pipeline.facts import LatencyModel

ROUTINGS: tuple[str, ...] = (
    "round-robin",
    "random",
    "least-loaded",
    "least-served",
    "affinity",
    "bounded-affinity",
    "cache-aware",
)
# Routings whose assignment never looks at cache state, so one stack-distance pass gives the
# hit ratio at every capacity (pipeline.sim.curve).
CACHE_INDEPENDENT: frozenset[str] = frozenset(ROUTINGS) - {"cache-aware"}


# sgl-router ``cache_aware`` defaults come in inconsistent layers (SIM_ANCHORS.md section 2):
# ``library`` is the Rust ``CacheAwareConfig::default`` of sglang-router 0.3.2
# (``src/policies/mod.rs`` L93-110, also smg ``f8daa88`` ``model_gateway/src/policies/mod.rs``
# L180-185); ``launcher`` is what the router's CLI (``src/main.rs`` L149-171) and Python launcher
# (``router_args.py`` L28-37) start with. Values: cache_threshold, balance_abs_threshold,
# balance_rel_threshold.
CACHE_AWARE_PRESETS: dict[str, tuple[float, int, float]] = {
    "library": (0.5, 32, 1.1),
    "launcher": (0.3, 64, 1.5),
}

REQUEST_LIFETIMES: tuple[str, ...] = ("durations", "instant")


@dataclass(frozen=True)
class CacheAwareConfig:
    """sgl-router ``cache_aware`` parameters; the defaults are the ``library`` preset.

    ``preset`` names the preset the values started from; ``overridden`` lists the keys set
    explicitly on top of it (see :meth:`from_preset`).
    """

    cache_threshold: float = CACHE_AWARE_PRESETS["library"][0]
    balance_abs_threshold: int = CACHE_AWARE_PRESETS["library"][1]
    balance_rel_threshold: float = CACHE_AWARE_PRESETS["library"][2]
    preset: str = "library"
    overridden: tuple[str, ...] = ()

    @classmethod
    def from_preset(cls, preset: str = "library", **overrides: Any) -> CacheAwareConfig:
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


@dataclass(frozen=True)
class SimulationConfig:
    block_sizes: tuple[int, ...] = (512,)
    replicas: tuple[int, ...] = (1, 4)
    cache_tokens: tuple[int, ...] = (1_000_000, 4_000_000)
    routings: tuple[str, ...] = ("round-robin", "affinity", "cache-aware")
    bounded_affinity_margin: float = 0.2
    random_seed: int = 0
    tenant_isolation: bool = False
    cache_aware: CacheAwareConfig = field(default_factory=CacheAwareConfig)
    latency_model: LatencyModel | None = None
    curve_points: int = 64
    request_lifetime: str = "durations"
    replica_slots: int | None = 64
    pinned_warn_share: float = 0.8

    def scenarios(self) -> list[Scenario]:
        """The grid, in a fixed order; replicas=1 runs only one routing (they are all equal)."""
        out: list[Scenario] = []
        for bs, reps, cap, routing in itertools.product(
            self.block_sizes, self.replicas, self.cache_tokens, self.routings
        ):
            if reps == 1 and routing != self.routings[0]:
                continue
            out.append(Scenario(bs, reps, cap, routing, self.tenant_isolation))
        return out


def _where(where: str, key: str) -> str:
    return f"{where}: simulation.{key}"


def _int_list(
    raw: dict[str, Any], key: str, default: tuple[int, ...], where: str
) -> tuple[int, ...]:
    value = raw.get(key, list(default))
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{_where(where, key)} must be a non-empty list of integers")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise ConfigError(f"{_where(where, key)} must hold non-negative integers, got {item!r}")
    return tuple(value)


def _number(raw: dict[str, Any], key: str, default: float, where: str, *, minimum: float) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise ConfigError(f"{_where(where, key)} must be a number >= {minimum}, got {value!r}")
    return float(value)


def _latency_model(
    value: Any, where: str, key: str, base: dict[str, Any] | None = None
) -> LatencyModel:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {key} must be a mapping")
    value = {**(base or {}), **value}
    allowed = {"ttft_base_ms", "ttft_per_prompt_token_ms", "tpot_ms", "source"}
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise ConfigError(f"{where}: {key} has unknown keys {unknown}")
    kwargs: dict[str, Any] = {}
    for name in ("ttft_base_ms", "ttft_per_prompt_token_ms", "tpot_ms"):
        if name in value:
            item = value[name]
            if isinstance(item, bool) or not isinstance(item, int | float) or item < 0:
                raise ConfigError(f"{where}: {key}.{name} must be a non-negative number")
            kwargs[name] = float(item)
    if "source" in value:
        kwargs["source"] = str(value["source"])
    return LatencyModel(**kwargs)


def parse_simulation_config(
    raw: dict[str, Any], *, where: str = "<config>", shape: dict[str, Any] | None = None
) -> SimulationConfig:
    """Validate the ``simulation`` section; ``shape`` (the shape section) lends its latency model."""
    known = {
        "block_sizes",
        "replicas",
        "cache_tokens",
        "routings",
        "bounded_affinity_margin",
        "random_seed",
        "tenant_isolation",
        "cache_aware",
        "latency_model",
        "curve_points",
        "request_lifetime",
        "replica_slots",
        "pinned_warn_share",
    }
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{where}: simulation has unknown keys {unknown}")
    defaults = SimulationConfig()
    block_sizes = _int_list(raw, "block_sizes", defaults.block_sizes, where)
    replicas = _int_list(raw, "replicas", defaults.replicas, where)
    if 0 in block_sizes:
        raise ConfigError(f"{_where(where, 'block_sizes')} must be positive")
    if 0 in replicas:
        raise ConfigError(f"{_where(where, 'replicas')} must be positive")
    cache_tokens = _int_list(raw, "cache_tokens", defaults.cache_tokens, where)
    routings_raw = raw.get("routings", list(defaults.routings))
    if isinstance(routings_raw, str):
        routings_raw = [routings_raw]
    if not isinstance(routings_raw, list) or not routings_raw:
        raise ConfigError(f"{_where(where, 'routings')} must be a non-empty list")
    for name in routings_raw:
        if name not in ROUTINGS:
            raise ConfigError(
                f"{_where(where, 'routings')}: unknown routing {name!r}; choose from {list(ROUTINGS)}"
            )
    margin = _number(
        raw, "bounded_affinity_margin", defaults.bounded_affinity_margin, where, minimum=0
    )
    seed = raw.get("random_seed", defaults.random_seed)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"{_where(where, 'random_seed')} must be a non-negative integer")
    isolation = raw.get("tenant_isolation", False)
    if not isinstance(isolation, bool):
        raise ConfigError(f"{_where(where, 'tenant_isolation')} must be true or false")
    cache_aware = _cache_aware(raw.get("cache_aware") or {}, where)
    lifetime = raw.get("request_lifetime", defaults.request_lifetime)
    if lifetime not in REQUEST_LIFETIMES:
        raise ConfigError(
            f"{_where(where, 'request_lifetime')} must be one of {list(REQUEST_LIFETIMES)}, "
            f"got {lifetime!r}"
        )
    slots = raw.get("replica_slots", defaults.replica_slots)
    if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int) or slots < 1):
        raise ConfigError(f"{_where(where, 'replica_slots')} must be a positive integer or null")
    warn_share = _number(raw, "pinned_warn_share", defaults.pinned_warn_share, where, minimum=0.0)
    latency: LatencyModel | None = None
    if raw.get("latency_model") is not None:
        latency = _latency_model(
            raw["latency_model"],
            where,
            "simulation.latency_model",
            base=(shape or {}).get("latency_model"),
        )
    elif shape and shape.get("latency_model") is not None:
        latency = _latency_model(shape["latency_model"], where, "shape.latency_model")
    points = raw.get("curve_points", defaults.curve_points)
    if isinstance(points, bool) or not isinstance(points, int) or points < 2:
        raise ConfigError(f"{_where(where, 'curve_points')} must be an integer >= 2")
    return SimulationConfig(
        block_sizes=block_sizes,
        replicas=replicas,
        cache_tokens=cache_tokens,
        routings=tuple(routings_raw),
        bounded_affinity_margin=margin,
        random_seed=seed,
        tenant_isolation=isolation,
        cache_aware=cache_aware,
        latency_model=latency,
        curve_points=points,
        request_lifetime=lifetime,
        replica_slots=slots,
        pinned_warn_share=warn_share,
    )


def _cache_aware(ca_raw: Any, where: str) -> CacheAwareConfig:
    """``cache_aware: {preset, cache_threshold?, balance_abs_threshold?, balance_rel_threshold?}``."""
    if not isinstance(ca_raw, dict):
        raise ConfigError(f"{_where(where, 'cache_aware')} must be a mapping")
    keys = ("cache_threshold", "balance_abs_threshold", "balance_rel_threshold")
    ca_unknown = sorted(set(ca_raw) - {"preset", *keys})
    if ca_unknown:
        raise ConfigError(f"{_where(where, 'cache_aware')} has unknown keys {ca_unknown}")
    preset = ca_raw.get("preset", "library")
    if preset not in CACHE_AWARE_PRESETS:
        raise ConfigError(
            f"{_where(where, 'cache_aware.preset')} must be one of {list(CACHE_AWARE_PRESETS)}, "
            f"got {preset!r}"
        )
    overrides: dict[str, Any] = {}
    if "cache_threshold" in ca_raw:
        threshold = _number(ca_raw, "cache_threshold", 0.0, where, minimum=0)
        if threshold > 1:
            raise ConfigError(f"{_where(where, 'cache_aware.cache_threshold')} must be in [0, 1]")
        overrides["cache_threshold"] = threshold
    if "balance_abs_threshold" in ca_raw:
        abs_thr = ca_raw["balance_abs_threshold"]
        if isinstance(abs_thr, bool) or not isinstance(abs_thr, int) or abs_thr < 0:
            raise ConfigError(
                f"{_where(where, 'cache_aware.balance_abs_threshold')} must be a non-negative "
                "integer"
            )
        overrides["balance_abs_threshold"] = abs_thr
    if "balance_rel_threshold" in ca_raw:
        overrides["balance_rel_threshold"] = _number(
            ca_raw, "balance_rel_threshold", 1.0, where, minimum=1.0
        )
    return CacheAwareConfig.from_preset(preset, **overrides)
