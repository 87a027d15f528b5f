"""Benchmark results: reading them, SLO capacity, cost, fleet and validity.

The stage shape (config, compute, result, present, checks, stage; its command in ``pipeline.commands``). Beside it:
``readers/`` (one reader per benchmark tool, into the load-point table of ``schema``),
``manifest`` (the sidecar manifest), and the computation ``compute`` composes: ``slo``,
``keepup``, ``latency_fit``, ``cost``, ``validity``, ``detect``, ``percentiles``, ``frames``.
"""
