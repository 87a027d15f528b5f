"""Capacity and cost for the team's own traffic (issue 19): a serving model fitted per
benchmarked deployment, carried to the workload's own request mix by simulation.

Entry points (pure; the stage wiring is the lead's):
:func:`pipeline.capacity.fit.fit_serving_model`,
:func:`pipeline.capacity.compute.carry_to_workload`,
:func:`pipeline.capacity.compute.capacity_result`,
:func:`pipeline.capacity.compute.routing_value`; the design is docs/capacity.md.
"""
