"""Prefix sharing: the shared-prefix curve, reuse potential, its age and tenant split, and the
curve's shape.

The stage shape (config, compute, result, present, checks, stage; its command in ``pipeline.commands``). Beside it:
``analysis`` (the out-of-core passes the stage runs), ``days`` (those passes carried on from
day to day for a union of days), ``sessions`` (session inference),
``hashmap`` and ``replay`` (its kernels), ``cache_rules`` (vLLM's hit limit, shared by every
replay).
"""
