"""Prefix sharing: the shared-prefix curve, reuse potential, its age and tenant split, and the
curve's shape. Session inference lives in :mod:`pipeline.sessions`."""

from __future__ import annotations

from pipeline.prefix.compute import (
    PrefixInputError,
    at_block_size,
    classify_curve,
    coarsen,
    reuse_per_request,
    reuse_summary,
    sharing_curve,
    table_block_size,
    window_grid,
)
from pipeline.prefix.config import PrefixConfig, parse_prefix_config
from pipeline.prefix.report import PrefixAnalysis, analyse, curve_markdown, curve_svg, session_stats

__all__ = [
    "PrefixAnalysis",
    "PrefixConfig",
    "PrefixInputError",
    "analyse",
    "at_block_size",
    "classify_curve",
    "coarsen",
    "curve_markdown",
    "curve_svg",
    "parse_prefix_config",
    "reuse_per_request",
    "reuse_summary",
    "session_stats",
    "sharing_curve",
    "table_block_size",
    "window_grid",
]
