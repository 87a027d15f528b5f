"""What-if: the decision re-run on changed inputs — named scenarios and the decision
map, the winning engine over a grid of two axes (docs/whatif.md).

The stage shape (config, compute, result, present, checks, stage; its command in ``pipeline.commands``). Nothing upstream re-runs:
each change moves the decision's own view of its inputs (:mod:`pipeline.decision.flips`).
"""
