"""Capacity and cost for the team's own traffic: a serving model fitted per
benchmarked deployment, carried to the workload's own request mix by simulation.

The stage shape (config, compute, result, present, checks, stage; its command in ``pipeline.commands``). Beside it: ``fit`` (the
serving model fitted from a deployment's load points and per-request rows, its error on each),
``prior`` (the roofline prior and the GPU datasheet table), ``search`` (capacity at the SLO:
sampled requests, Poisson arrivals, bisection on the rate) and their compiled ``kernels`` (the
replica simulation). The design is docs/capacity.md.
"""
