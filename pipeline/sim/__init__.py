"""Prefix-cache and routing replay (vLLM APC semantics) across replicas, and hit-rate curves.

Public API:
- :func:`sim_input` flattens a canonical request table once (hashes → dense ids per variant);
- :func:`assign` routes requests for cache-independent routings; :func:`simulate` replays one
  :class:`Scenario` in the ``durations`` or ``instant`` request lifetime (one event-driven
  kernel; the cache-aware router runs inside it); :func:`summarise` gives its statistics;
- :func:`capacity_curve` gives hit tokens at every capacity from one stack-distance pass;
- ``stage`` holds the contract the assets and the command share.
"""
