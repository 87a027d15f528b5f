"""The quarterly schedule reports on the quarter that ended; the trace sensor fires only when
a configured trace file changes."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import dagster as dg
import yaml

from assets.definitions import defs
from assets.report import quarter_before
from assets.resources import EnginefitStore
from tests.conftest import bundled_config


def test_a_run_at_the_start_of_a_quarter_reports_on_the_one_that_ended() -> None:
    assert quarter_before(dt.date(2026, 10, 1)) == "2026-Q3"
    assert quarter_before(dt.date(2027, 1, 1)) == "2026-Q4"
    schedule = defs.resolve_schedule_def("quarterly_report")
    when = dt.datetime(2026, 10, 1, 6, tzinfo=dt.UTC)
    with dg.build_schedule_context(scheduled_execution_time=when) as context:
        request = schedule.evaluate_tick(context).run_requests[0]  # type: ignore[index]
    assert request.tags["enginefit/quarter"] == "2026-Q3"
    assert request.run_config == {"resources": {"store": {"config": {"quarter": "2026-Q3"}}}}


def test_the_trace_sensor_fires_when_a_trace_changes(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-01 00:00:00,10,5\n")
    config = bundled_config(tmp_path, "s")
    raw = yaml.safe_load(config.read_text())
    raw["workload"]["traces"] = [{"path": str(trace), "format": "auto"}]
    config.write_text(yaml.safe_dump(raw))
    sensor = defs.resolve_sensor_def("new_traces")
    store = EnginefitStore(config_path=str(config))

    def tick(cursor: str | None) -> dg.SensorResult:
        context = dg.build_sensor_context(cursor=cursor, resources={"store": store})
        return sensor.evaluate_tick(context)  # type: ignore[return-value]

    first = tick(None)
    assert len(first.run_requests or []) == 1 and first.cursor
    assert not tick(first.cursor).run_requests
    os.utime(trace, ns=(1, 1))
    assert len(tick(first.cursor).run_requests or []) == 1
