"""Pure predicates over a capacity result: each returns the problems it found (empty: fine)."""

from __future__ import annotations

import math

from pipeline.capacity.result import CapacityResult, WorkloadCost
from pipeline.unknown import Unknown

#: A fitted model whose mean-gap / mean-TTFT error on its own points is above this is suspect.
MAX_RESIDUAL_SPREAD = 0.25


def capacity_within_band(result: CapacityResult) -> list[str]:
    """Every known capacity lies inside its band, and the band is ordered."""
    problems = []
    for c in result.candidates:
        cap, band = c.workload_capacity_rps, c.workload_capacity_band_rps
        if isinstance(cap, Unknown) or isinstance(band, Unknown):
            continue
        if not band[0] <= cap <= band[1]:
            problems.append(f"{c.candidate}: capacity {cap:.4g} outside its band {band}")
    return problems


def no_zero_stands_for_unknown(result: CapacityResult) -> list[str]:
    """A capacity, band or price is either a positive finite number or an Unknown."""
    problems = []
    for c in result.candidates:
        figures: list[tuple[str, float | Unknown]] = [("capacity", c.workload_capacity_rps)]
        if isinstance(c.cost, WorkloadCost):
            figures += [
                ("cost_per_1m_output_usd", c.cost.cost_per_1m_output_usd),
                ("all_in_cost_per_1m_output_usd", c.cost.all_in_cost_per_1m_output_usd),
                ("monthly_cost_usd", c.cost.monthly_cost_usd),
            ]
        for name, value in figures:
            if not isinstance(value, Unknown) and not (math.isfinite(value) and value > 0):
                problems.append(f"{c.candidate}: {name} is {value!r}, not a positive figure")
    return problems


def fit_errors_reported(result: CapacityResult) -> list[str]:
    """Every fitted model reports its error on the points it was fitted on, within bounds."""
    problems = []
    for c in result.candidates:
        model = c.serving_model
        if isinstance(model, Unknown):
            continue
        if len(model.point_errors) != model.points_used:
            problems.append(
                f"{c.candidate}: {model.points_used} points fitted, errors for "
                f"{len(model.point_errors)}"
            )
        if model.residual_spread > MAX_RESIDUAL_SPREAD:
            problems.append(
                f"{c.candidate}: the model misses its own points by {model.residual_spread:.0%} "
                f"(RMS), above {MAX_RESIDUAL_SPREAD:.0%}"
            )
    return problems


def far_transfers_are_provisional(result: CapacityResult) -> list[str]:
    """A transfer far outside the measured mix always carries a provisional reason."""
    return [
        f"{c.candidate}: far transfer without a provisional reason"
        for c in result.candidates
        if not isinstance(c.transfer, Unknown) and c.transfer.far and not c.provisional_reason
    ]
