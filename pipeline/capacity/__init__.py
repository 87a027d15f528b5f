"""Capacity and cost for the team's own traffic: a serving model fitted per
benchmarked deployment, carried to the workload's own request mix by simulation.

The stage shape (config, compute, result, present, checks, stage, cli). Beside it: ``fit`` (the
serving model fitted from a deployment's load points and per-request rows, its error on each),
``prior`` (the roofline prior and the GPU datasheet table), ``search`` (capacity at the SLO:
sampled requests, the traffic's own arrivals, bisection on the rate), ``fleet_cache`` (the
fleet's own prefix cache, replayed per fleet size and KV pool) and their compiled ``kernels``
(the replica simulation). The design is docs/capacity.md.
"""
