"""Settings of the report stage (defaults and their meaning: ``pipeline/defaults.yaml``)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from pipeline.settings import Section


def _quarter(value: Any) -> Any:
    from pipeline.report.versions import QUARTER

    if isinstance(value, str) and not QUARTER.match(value):
        raise ValueError(f"{value!r} is not a quarter: write YYYY-Qn, e.g. 2026-Q3")
    return value


class ReportSettings(Section):
    """``quarter``: the quarter the report is for (null: the quarter of the workload's last
    arrival); ``title`` and ``organisation`` appear on the title page."""

    quarter: Annotated[str, BeforeValidator(_quarter)] | None
    title: Annotated[str, Field(min_length=1, max_length=120)]
    organisation: Annotated[str, Field(max_length=120)] | None
