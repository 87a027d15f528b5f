"""Prefix-cache and routing replay (vLLM APC semantics) across replicas, and hit-rate curves.

Public API:
- :func:`sim_input` flattens a canonical request table once (hashes → dense ids per variant);
- :func:`assign` routes requests for cache-independent routings; :func:`simulate` replays one
  :class:`Scenario` in the ``durations`` or ``instant`` request lifetime (one event-driven
  kernel; the cache-aware router runs inside it); :func:`summarise` gives its statistics;
- :func:`capacity_curve` gives hit tokens at every capacity from one stack-distance pass;
- ``stage`` holds the contract the assets and the command share.
"""

from pipeline.sim.blocks import BlockView, SimInput, SimulationInputError, sim_input
from pipeline.sim.config import (
    CACHE_AWARE_PRESETS,
    CACHE_INDEPENDENT,
    REQUEST_LIFETIMES,
    ROUTINGS,
    CacheAwareConfig,
    Scenario,
    SimulationConfig,
)
from pipeline.sim.curve import Curve, capacity_curve
from pipeline.sim.replay import (
    Assignment,
    ScenarioRun,
    affinity_home,
    assign,
    per_replica_frame,
    simulate,
    summarise,
)

__all__ = [
    "CACHE_AWARE_PRESETS",
    "CACHE_INDEPENDENT",
    "REQUEST_LIFETIMES",
    "ROUTINGS",
    "Assignment",
    "BlockView",
    "CacheAwareConfig",
    "Curve",
    "Scenario",
    "ScenarioRun",
    "SimInput",
    "SimulationConfig",
    "SimulationInputError",
    "affinity_home",
    "assign",
    "capacity_curve",
    "per_replica_frame",
    "sim_input",
    "simulate",
    "summarise",
]
