"""What serving costs: GPU prices and their one precedence (:meth:`Prices.price_for`), the
replicas a rate needs, the monthly bill, costs per million tokens, the payback of a switch, and
the formulas' text built from the same constants. Every stage, the decision record, the
document's workings and the what-if call it (docs/decision-rules.md#cost-formula).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import polars as pl

from pipeline.errors import ConfigError

HOURS_PER_MONTH = 730.0  # 8,760 hours a year ÷ 12
SECONDS_PER_HOUR = 3600.0
SECONDS_PER_MONTH = HOURS_PER_MONTH * SECONDS_PER_HOUR
TOKENS_PER_MILLION = 1e6
HOURS_PER_WEEK = 40.0  # an engineer-week
WEEKS_PER_MONTH = HOURS_PER_MONTH / (24 * 7)
MONTHS_PER_QUARTER = 3
# A rate a hair above a whole number of replicas' capacity is that number: 92.19 ÷ 92.19 computed
# as 1.0000000001 is one replica, not two.
REPLICA_ROUNDING_GUARD = 1e-9
# The widest price a GPU-hour may have: the dearest GPUs rent for tens of dollars an hour, so a
# thousand is past any real price, and every dollar figure built from one stays printable.
MAX_GPU_HOUR_USD = 1_000.0

COST_FORMULA = (
    f"cost per 1M tokens = gpu_count × $/GPU-hour ÷ (tokens/s × {SECONDS_PER_HOUR:g}) × 10^6"
)
FLEET_FORMULA = (
    "replicas = ceil(rate_rps ÷ capacity_rps); gpus = replicas × gpu_count; "
    f"monthly_usd = gpus × $/GPU-hour × {HOURS_PER_MONTH:g} h"
)

# A float, or a polars expression of floats: the same arithmetic serves both.
Amount = TypeVar("Amount", float, pl.Expr)


def per_million(usd: Amount, tokens: Amount) -> Amount:
    """Dollars per million tokens: ``usd`` spent over the time ``tokens`` were served."""
    return usd / tokens * TOKENS_PER_MILLION


def monthly_usd(gpus: Amount, gpu_hour_usd: Amount) -> Amount:
    """What ``gpus`` GPUs cost a month at ``gpu_hour_usd`` each an hour."""
    return gpus * gpu_hour_usd * HOURS_PER_MONTH


def fractional_replicas(
    rate_rps: float, capacity_rps: float, headroom: float = 1.0, spare: bool = False
) -> float:
    """The fleet before rounding up to whole replicas (what the ranking compares); the N+1
    spare stays whole."""
    return rate_rps / (capacity_rps * headroom) + spare


def replicas_for(
    rate_rps: float, capacity_rps: float, headroom: float = 1.0, spare: bool = False
) -> int:
    """Whole replicas to serve ``rate_rps``: at least one, plus one spare with N+1."""
    load = rate_rps / (capacity_rps * headroom)
    return max(math.ceil(load - REPLICA_ROUNDING_GUARD), 1) + spare


# A band: the low and high end of a figure whose capacity is known only within a band.
Band = tuple[float, float]
# One end of a payback band: months, or never (that end saves nothing a month).
PaybackEnd = float | Literal["never"]


def replicas_band(
    rate_rps: float, capacity_band_rps: Band, headroom: float = 1.0, spare: bool = False
) -> tuple[int, int]:
    """Whole replicas at the capacity band's ends: (fewest, most). The high capacity needs
    the fewer replicas."""
    low, high = capacity_band_rps
    return (
        replicas_for(rate_rps, high, headroom, spare),
        replicas_for(rate_rps, low, headroom, spare),
    )


def fractional_replicas_band(
    rate_rps: float, capacity_band_rps: Band, headroom: float = 1.0, spare: bool = False
) -> Band:
    """:func:`fractional_replicas` at the capacity band's ends: (fewest, most)."""
    low, high = capacity_band_rps
    return (
        fractional_replicas(rate_rps, high, headroom, spare),
        fractional_replicas(rate_rps, low, headroom, spare),
    )


def per_capacity_band(value_at_capacity: float, capacity_rps: float, band: Band) -> Band:
    """A figure inversely proportional to the capacity (a cost per token at the SLO: the same
    hour over more or fewer tokens) at the capacity band's ends: (lowest, highest)."""
    low, high = band
    return value_at_capacity * capacity_rps / high, value_at_capacity * capacity_rps / low


def saving_band(here: Band, there: Band) -> Band:
    """What moving from a bill of ``here`` to one of ``there`` saves a month at worst and at
    best, both known only within their bands: (here's low − there's high, here's high −
    there's low)."""
    return here[0] - there[1], here[1] - there[0]


def payback_band(one_off_usd: Band, monthly_saving_usd: Band) -> tuple[PaybackEnd, PaybackEnd]:
    """(soonest, latest) payback: the smaller one-off over the larger saving, the larger
    one-off over the smaller saving; an end whose saving is nil or negative is ``"never"``,
    never a negative or infinite number of months."""

    def end(one_off: float, saving: float) -> PaybackEnd:
        months = payback_months(one_off, saving)
        return "never" if months is None else months

    return end(one_off_usd[0], monthly_saving_usd[1]), end(one_off_usd[1], monthly_saving_usd[0])


def known_sum(a: float | None, b: float | None) -> float | None:
    """``a + b``, unknown when either is."""
    return a + b if a is not None and b is not None else None


def monthly_bill(monthly_total_usd: float | None, monthly_gpu_usd: float | None) -> float | None:
    """What running an engine costs a month: GPUs and model changes where that total is known,
    else the GPUs alone (None: neither is)."""
    return monthly_total_usd if monthly_total_usd is not None else monthly_gpu_usd


def parallel_run_usd(monthly_usd_: float, weeks: float) -> float:
    """A fleet billed at ``monthly_usd_`` a month, run for ``weeks``."""
    return monthly_usd_ * weeks / WEEKS_PER_MONTH


def payback_months(one_off_usd: float, monthly_saving_usd: float) -> float | None:
    """Months until ``monthly_saving_usd`` pays back ``one_off_usd``; None when it never does
    (the saving is nil or negative)."""
    return one_off_usd / monthly_saving_usd if monthly_saving_usd > 0 else None


@dataclass(frozen=True)
class Prices:
    """$ per GPU-hour by GPU type, a default, and an override that beats everything."""

    gpu_hour_usd: Mapping[str, float] = field(default_factory=dict)
    default: float | None = None
    override: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpu_hour_usd": dict(sorted(self.gpu_hour_usd.items())),
            "default": self.default,
            "override": self.override,
        }

    def price_for(
        self, gpu_type: str | None, manifest_price: float | None
    ) -> tuple[float | None, str]:
        """The $ per GPU-hour of a deployment on ``gpu_type`` whose benchmark manifest gives
        ``manifest_price``, and where it came from: the override (``--gpu-hour-usd``) > the
        configured price for the GPU type > the manifest's > the configured default;
        ``(None, "no price")`` when none applies."""
        if self.override is not None:
            return self.override, "--gpu-hour-usd"
        configured = self._configured(gpu_type)
        if configured is not None:
            return configured
        if manifest_price is not None:
            return manifest_price, "manifest price_per_gpu_hour_usd"
        if self.default is not None:
            return self.default, "config gpu_hour_usd.default"
        return None, "no price"

    def _configured(self, gpu_type: str | None) -> tuple[float, str] | None:
        """The configured price for one GPU type: exact (case/punctuation-blind) match, else
        the longest configured name contained in it (``H100`` matches ``NVIDIA-H100-80GB``)."""
        if gpu_type is None:
            return None
        norm = _norm(gpu_type)
        exact = [k for k in self.gpu_hour_usd if _norm(k) == norm]
        contained = sorted(
            (k for k in self.gpu_hour_usd if _norm(k) and _norm(k) in norm),
            key=lambda k: (-len(_norm(k)), k),
        )
        found = exact or contained
        return (self.gpu_hour_usd[found[0]], f"config gpu_hour_usd.{found[0]}") if found else None

    def describe(self) -> str:
        """Where this run's $ per GPU-hour come from, highest precedence first, for the first
        lines of the output (the configuration file is named on the command's first line)."""
        if self.override is not None:
            return (
                f"--gpu-hour-usd {self.override:g} for every GPU type (over the configuration "
                "and the manifests)"
            )
        parts = []
        if self.gpu_hour_usd:
            table = ", ".join(
                f"{name} {price:g}" for name, price in sorted(self.gpu_hour_usd.items())
            )
            parts.append(f"the configuration's bench.prices by GPU type ({table})")
        parts.append("the manifests' price_per_gpu_hour_usd")
        if self.default is not None:
            parts.append(f"the configuration's default {self.default:g}")
        text = ", then ".join(parts)
        if len(parts) == 1:
            text += " only (no bench.prices configured); without one the cost is unknown"
        return text

    def configured_rows(self) -> list[tuple[str, float]]:
        """The configured prices as (GPU type, $ per GPU-hour): by type, then the default."""
        rows = sorted(self.gpu_hour_usd.items())
        if self.default is not None:
            rows.append((DEFAULT_PRICE_LABEL, self.default))
        return rows


DEFAULT_PRICE_LABEL = "default (a GPU type not listed whose manifest gives no price)"


def _norm(text: str) -> str:
    return re.sub(r"[^0-9A-Z]", "", text.upper())


def parse_price(value: Any, where: str) -> float:
    """A $ per GPU-hour price: 0 to :data:`MAX_GPU_HOUR_USD` (``where`` names the key or flag)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: must be a price in $ per GPU-hour, got {value!r}")
    price = float(value)
    if not math.isfinite(price) or not 0 <= price <= MAX_GPU_HOUR_USD:
        raise ConfigError(
            f"{where}: a price is 0 to {MAX_GPU_HOUR_USD:g} $ per GPU-hour, got {value!r}"
        )
    return price + 0.0  # -0.0 → 0.0


def prices_from_mapping(raw: Any, *, where: str = "bench.prices") -> Prices:
    """``{gpu_hour_usd: {H100: 3.0, L40S: 1.2, default: 3.0}}`` or ``{gpu_hour_usd: 3.0}``."""
    if raw is None:
        return Prices()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a mapping with key gpu_hour_usd")
    unknown = sorted(str(k) for k in raw if k != "gpu_hour_usd")
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; expected gpu_hour_usd")
    table = raw.get("gpu_hour_usd")
    if table is None:
        return Prices()
    if not isinstance(table, Mapping):
        return Prices(default=parse_price(table, f"{where}.gpu_hour_usd"))
    by_type: dict[str, float] = {}
    default: float | None = None
    for key, value in table.items():
        name = str(key).strip()
        if not name:
            raise ConfigError(f"{where}.gpu_hour_usd: empty GPU type name")
        price = parse_price(value, f"{where}.gpu_hour_usd.{name}")
        if name.lower() == "default":
            default = price
        else:
            by_type[name] = price
    return Prices(gpu_hour_usd=by_type, default=default)
