"""Capacity and cost for the team's own traffic: a serving model fitted per
benchmarked deployment, carried to the workload's own request mix by simulation.

The stage shape (config, compute, result, present, checks, stage; its command in
``pipeline.commands``). Beside it: ``fit`` (the
serving model fitted from a deployment's load points and per-request rows, its prefill budget,
its error on each, the self-check), ``limits`` (each deployment's scheduling limits and their
sources), ``prior`` (the roofline prior, the physical floors and the GPU datasheet table),
``models`` (the model table, ``models.yaml``), ``search`` (capacity at the SLO: sampled
requests, the traffic's own arrivals, bisection on the rate), ``binding`` (what binds a
capacity), ``fleet_cache`` (the fleet's own prefix cache, replayed per fleet size and KV pool)
and their compiled ``kernels`` (the replica simulation). The design is docs/capacity.md.
"""
