"""Minimal reader of the capacity stage's output (a stub until the capacity stage lands: only
:func:`read_result`, reading ``<workload>/capacity/capacity.json``)."""

from __future__ import annotations

import json

from pipeline.capacity.result import CapacityResult
from pipeline.errors import InputFormatError
from pipeline.layout import WorkloadLayout, require_output


def read_result(layout: WorkloadLayout) -> CapacityResult:
    """The workload's capacity result; the project's missing-output error when the stage has
    not run."""
    path = require_output(
        layout.root / "capacity" / "capacity.json",
        "capacity result",
        "capacity",
        "workload_capacity",
    )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputFormatError(f"{path}: not a JSON capacity result ({exc})") from exc
    return CapacityResult.from_json(data, str(path))
