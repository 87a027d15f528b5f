"""Prefix sharing: the shared-prefix curve, reuse potential, its age and tenant split, and the
curve's shape. Session inference lives in :mod:`pipeline.prefix.sessions`; ``stage`` holds the contract
the asset and the command share."""

from __future__ import annotations

from pipeline.prefix.analysis import analyse, session_stats
from pipeline.prefix.compute import (
    PrefixInputError,
    classify_curve,
    reuse_summary,
    table_block_size,
    window_grid,
)
from pipeline.prefix.config import PrefixConfig
from pipeline.prefix.result import PrefixResult

__all__ = [
    "PrefixConfig",
    "PrefixInputError",
    "PrefixResult",
    "analyse",
    "classify_curve",
    "reuse_summary",
    "session_stats",
    "table_block_size",
    "window_grid",
]
