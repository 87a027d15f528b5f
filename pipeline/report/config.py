"""Settings of the report stage (defaults and their meaning: ``pipeline/defaults.yaml``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from pipeline.settings import ConfigQuarter, Section


class ReportConfig(Section):
    """``quarter``: the quarter the report is for (null: the quarter of the workload's last
    arrival); ``title`` and ``organisation`` appear on the title page."""

    quarter: ConfigQuarter | None
    title: Annotated[str, Field(min_length=1, max_length=120)]
    organisation: Annotated[str, Field(max_length=120)] | None
