"""The engine decision: candidates from the catalog judged against the requirements and the
typed stage results, ranked by cost, with the triggers that would revisit it.

The stage shape (config, compute, result, present, checks, stage; its command in ``pipeline.commands``). Beside it: the parts
``compute`` composes (``context``, ``evidence``, ``rules``, ``costing``, ``routing``,
``triggers``) and ``catalog`` (``engines.yaml``, validated on load).
"""
