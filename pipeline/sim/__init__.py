"""Prefix-cache and routing replay (vLLM APC semantics) across replicas, and hit-rate curves.

The stage shape (config, compute, result, present, checks, stage; its command in ``pipeline.commands``). Beside it: ``blocks``
(the canonical table flattened once: hashes → dense ids per variant), ``replay`` (one scenario
replayed in the ``durations`` or ``instant`` request lifetime, the cache-aware router inside
it), ``curve`` (hit tokens at every capacity from one stack-distance pass), their compiled
``kernels`` and ``curve_kernels``, and ``memo`` (the one large input a process keeps between
the scenario steps that share it).
"""
