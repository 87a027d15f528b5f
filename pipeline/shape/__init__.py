"""Workload shape: arrivals, lengths, concurrency, traffic mix, and where that puts the workload.

The stage shape (config, compute, result, present, checks, stage; its command in ``pipeline.commands``); no Dagster here. The
JSON keys are documented in ``docs/shape.md``. Beside it: the parts ``compute`` composes
(``arrivals``, ``lengths``, ``concurrency``, ``mix``, ``findings``, ``common``) and ``facts``
(the workload facts the bench stage reads).
"""
