"""What the prefix stage produces: the JSON summary (keys: ``docs/prefix.md``) and its frames.

The summary round-trips through JSON; the frames are written as Parquet. The per-request
replay is not kept (the summary holds its totals); ``reuse`` stays empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl


@dataclass(frozen=True)
class PrefixResult:
    summary: dict[str, Any]
    curve: pl.DataFrame
    sessions: pl.DataFrame
    reuse: pl.DataFrame = field(default_factory=pl.DataFrame)

    def to_json(self) -> dict[str, Any]:
        return self.summary

    @classmethod
    def from_json(
        cls, summary: dict[str, Any], curve: pl.DataFrame, sessions: pl.DataFrame
    ) -> PrefixResult:
        return cls(summary=summary, curve=curve, sessions=sessions)

    def shared_prefix_ratio(self) -> dict[int, float]:
        """DOMAIN.md's shared-prefix ratio per window W (tokens): the share of all requests
        whose first W tokens another request also starts with. Empty without content."""
        return {
            int(point["window_tokens"]): float(point["share"])
            for point in self.summary.get("curve", [])
            if point.get("share") is not None
        }
