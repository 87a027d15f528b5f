"""The bench stage's inputs, read through the layout alike by the assets and ``enginefit bench``.

The workload facts come from the shape stage's result, with the shared-prefix curve of the
prefix stage joined in when it ran; either missing is said (the checks that need it are then
``unknown``), never assumed.
"""

from __future__ import annotations

import dataclasses

from pipeline.errors import InputFormatError
from pipeline.facts import WorkloadFacts
from pipeline.layout import WorkloadLayout
from pipeline.prefix import stage as prefix_stage
from pipeline.shape import stage as shape_stage


def workload_facts(layout: WorkloadLayout) -> tuple[WorkloadFacts | None, str]:
    """The workload's facts and where they came from (or why there are none)."""
    try:
        facts = shape_stage.read_result(layout).facts
    except InputFormatError as exc:
        return None, f"{exc}: production checks unknown, no fleet sizing"
    source = str(layout.shape.summary)
    try:
        ratios = prefix_stage.read_result(layout).shared_prefix_ratio()
    except InputFormatError:
        return facts, f"{source} (no prefix stage output: prefix sharing unknown)"
    return (
        dataclasses.replace(facts, shared_prefix_ratio=ratios),
        f"{source} + {layout.prefix.summary}",
    )
