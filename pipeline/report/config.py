"""Settings of the report stage (defaults and their meaning: ``pipeline/defaults.yaml``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from pipeline.settings import ConfigQuarter, Section


class ReportConfig(Section):
    """``quarter``: the quarter the report is for (null: the quarter of the workload's last
    arrival); ``allow_other_quarter``: file it under a quarter the traffic does not reach;
    ``title`` and ``organisation`` appear on the title page."""

    quarter: ConfigQuarter | None
    allow_other_quarter: bool
    title: Annotated[str, Field(min_length=1, max_length=120)]
    organisation: Annotated[str, Field(max_length=120)] | None
