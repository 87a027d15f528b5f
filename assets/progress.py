"""A Dagster logger for ``enginefit report``: one line on standard error per finished step
(asset, check or scenario), with its duration, instead of Dagster's event log.

It is defined on the one ``Definitions`` but used only when a run's config names it, so a run
launched from the UI keeps Dagster's own console logger.
"""

from __future__ import annotations

import logging
import sys

import dagster as dg
from dagster._core.log_manager import LOG_RECORD_METADATA_ATTR

PROGRESS_LOGGER = "enginefit_progress"


class _StepLines(logging.Handler):
    """Writes a line for each step that succeeded or failed; ignores every other record."""

    def emit(self, record: logging.LogRecord) -> None:
        meta = getattr(record, LOG_RECORD_METADATA_ATTR, None) or {}
        event = meta.get("dagster_event")
        if event is None or event.step_key is None:
            return
        if event.event_type == dg.DagsterEventType.STEP_SUCCESS:
            seconds = event.event_specific_data.duration_ms / 1000
            print(f"enginefit report: {event.step_key} done ({seconds:.1f} s)", file=sys.stderr)
        elif event.event_type == dg.DagsterEventType.STEP_FAILURE:
            print(f"enginefit report: {event.step_key} FAILED", file=sys.stderr)


@dg.logger(
    config_schema=None, description="One line per finished step on stderr (enginefit report)."
)
def progress_logger(init_context: dg.InitLoggerContext) -> logging.Logger:
    del init_context
    log = logging.getLogger(PROGRESS_LOGGER)
    log.setLevel(logging.DEBUG)
    log.propagate = False
    if not log.handlers:
        log.addHandler(_StepLines())
    return log
