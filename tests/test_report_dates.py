"""The report date: one date the decision and its report are as of, every age measured from
it and never negative, dates from the future refused, the quarter matched to the traffic, and
the changes section comparing like with like."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from assets.cli import main as enginefit_dagster
from assets.report import configured_inputs
from pipeline import dates
from pipeline.bench.manifest import BenchManifestError, load_manifest, validate_manifest
from pipeline.cli import main as enginefit
from pipeline.config import load_config
from pipeline.decision import stage as decision_stage
from pipeline.errors import ConfigError, InputFormatError
from pipeline.ledger import MANIFEST
from pipeline.report import stage
from pipeline.report.compute import build
from pipeline.report.sections.changes import configuration_changes
from tests.bundled_report import Bundle, html_text, pdf_text, publish, workload
from tests.conftest import REPO
from tests.decision_fixtures import (
    AS_OF,
    RUN_DATE,
    configuration,
    decide_on,
    steady_traffic,
    sweep,
)

BUNDLED_MANIFEST = REPO / "bench-results" / "vllm-h100-inference-perf" / "enginefit-bench.yaml"
# The upstream commands that read the bench section (its report date and prices): the ones a
# change of either runs again before the decision, the what-if map and the report.
BENCH_READERS = ("bench", "capacity")


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The command's one error line (after its progress lines), with no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("enginefit: error: ")]
    assert len(errors) == 1, err
    return errors[0]


def set_clock(monkeypatch: pytest.MonkeyPatch, day: str) -> None:
    monkeypatch.setattr(dates, "today", lambda: dt.date.fromisoformat(day))


def edit(config: Path, **changes: object) -> Path:
    """``config`` with ``section.key`` values replaced (``bench__as_of=None`` drops the date)."""
    raw = yaml.safe_load(config.read_text())
    for dotted, value in changes.items():
        section, key = dotted.split("__", 1)
        raw.setdefault(section, {})[key] = value
    config.write_text(yaml.safe_dump(raw))
    return config


def bench_copy(tmp_path: Path, run_date: str) -> Path:
    """The bundled benchmark folder with its manifest's run_date replaced (unquoted, as a user
    writes it)."""
    folder = tmp_path / "bench-results"
    shutil.copytree(REPO / "bench-results", folder)
    manifest = folder / BUNDLED_MANIFEST.relative_to(REPO / "bench-results")
    manifest.write_text(
        manifest.read_text().replace("run_date: 2025-11-05", f"run_date: {run_date}")
    )
    return manifest


# ------------------------------------------------------------------- dates that cannot be


def test_an_impossible_run_date_names_the_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "enginefit-bench.yaml"
    path.write_text("engine: vllm\ngpu_type: H100\ngpu_count: 1\nrun_date: 2025-02-30\n")
    raw = load_manifest(path)  # PyYAML would raise a bare ValueError here
    assert raw["run_date"] == "2025-02-30"
    with pytest.raises(BenchManifestError, match=r"manifest key 'run_date' must be a calendar"):
        validate_manifest(raw, str(path))
    # A date with a time is still a date.
    raw["run_date"] = "2025-11-05T10:00:00Z"
    assert validate_manifest(raw, str(path)).run_date == dt.date(2025, 11, 5)


@pytest.mark.parametrize("command", ["bench", "decide", "report"])
def test_an_impossible_run_date_is_one_line_from_each_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    manifest = bench_copy(tmp_path, "2025-02-30")
    config = edit(
        workload(tmp_path, drop_last=12_000), bench__results=[str(manifest.parent.parent)]
    )
    run = enginefit if command == "bench" else enginefit_dagster
    assert run([command, "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "Dagster" not in err  # refused before the graph starts: no step ran first
    lines = err.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in err
    assert lines[-1].endswith(
        f"{manifest}: manifest key 'run_date' must be a calendar date YYYY-MM-DD (got '2025-02-30')"
    )


def test_a_benchmark_from_the_future_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    set_clock(monkeypatch, "2026-12-01")
    manifest = bench_copy(tmp_path, "2999-01-01")
    results = manifest.parent
    # No report date: today is the limit.
    assert enginefit(["bench", str(results), "--json"]) == 2
    err = error_line(capsys)
    assert f"(manifest {manifest}): run_date 2999-01-01 is after today (2026-12-01)" in err
    # A report date before the run: the run cannot be measured from it either.
    manifest.write_text(manifest.read_text().replace("2999-01-01", "2026-06-01"))
    assert enginefit(["bench", str(results), "--as-of", "2026-05-31", "--json"]) == 2
    err = error_line(capsys)
    assert "run_date 2026-06-01 is after the report date (2026-05-31)" in err
    assert enginefit(["bench", str(results), "--as-of", "2026-06-01", "--json"]) == 0
    capsys.readouterr()


def test_an_as_of_in_the_future_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    set_clock(monkeypatch, "2026-12-01")
    results = REPO / "bench-results"
    assert enginefit(["bench", str(results), "--as-of", "2999-01-01"]) == 2
    assert error_line(capsys).startswith(
        "enginefit: error: --as-of: 2999-01-01 is after today (2026-12-01): a decision cannot "
        "be dated in the future; give today's date or an earlier one"
    )
    # decide refuses it before Dagster runs anything; so do the configuration and environment.
    config = workload(tmp_path)
    assert enginefit_dagster(["decide", "--config", str(config), "--as-of", "2999-01-01"]) == 2
    assert "--as-of: 2999-01-01 is after today (2026-12-01)" in error_line(capsys)
    with pytest.raises(ConfigError, match=r"bench.as_of: .*2999-01-01 is after today"):
        load_config(edit(config, bench__as_of="2999-01-01"))
    monkeypatch.setenv("ENGINEFIT_RUN_DATE", "2999-01-01")
    assert enginefit(["bench", str(results)]) == 2
    assert "ENGINEFIT_RUN_DATE: 2999-01-01 is after today" in error_line(capsys)


def test_a_catalog_from_the_future_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_clock(monkeypatch, "2026-12-01")
    catalog = tmp_path / "engines.yaml"
    text = (REPO / "pipeline" / "decision" / "engines.yaml").read_text()
    catalog.write_text(text.replace("since: 2025-12-11", "since: 2999-01-01", 1))
    with pytest.raises(ConfigError) as raised:
        decide_on(
            tmp_path, steady_traffic(), [sweep("vllm", 5.0)], decision={"catalog": str(catalog)}
        )
    assert str(raised.value).startswith(
        f"{catalog}: engines.tgi.status.since: 2999-01-01 is after today (2026-12-01)"
    )


def test_a_decision_dated_before_its_benchmark_is_refused(tmp_path: Path) -> None:
    """The benchmark ran 2026-11-01 (28 days before the 2026-11-29 report date); a decision
    dated before the run would give it a negative age: an error naming the result file and its
    manifest, from the bench stage and from the decision alike."""
    record = decide_on(tmp_path / "ok", steady_traffic(), [sweep("vllm", 5.0)])
    assert record.as_of == AS_OF
    assert record.measured("bench.age_days[vllm]") == 28
    folder = tmp_path / "ok" / "bench-results" / "0-vllm"
    config = configuration(tmp_path / "ok", results=[folder])
    with pytest.raises(InputFormatError) as raised:
        policy = dataclasses.replace(config.bench.policy(), as_of=dt.date(2026, 10, 31))
        decision_stage.read_inputs(config.layout(), config.decision, policy)
    assert f"(manifest {folder / 'enginefit-bench.yaml'}): run_date 2026-11-01 is after the " in (
        str(raised.value)
    )
    later = sweep("vllm", 5.0, run_date=RUN_DATE + dt.timedelta(days=30))
    with pytest.raises(InputFormatError, match=r"run_date 2026-12-01 is after the report date"):
        decide_on(tmp_path / "early", steady_traffic(), [later])


# --------------------------------------------------------------- the bundled document


def test_the_bundled_document_has_a_date_and_no_negative_age(bundled: Bundle) -> None:
    """Report date 2026-11-29 (bench.as_of): the benchmark (2025-11-05) is after the traffic's
    last day (2025-02-21) and 389 days old; the catalog (2026-12-01) two days newer than the
    report: said in words, its age 0, never −2 or −647."""
    published = bundled.first
    manifest = json.loads((published.folder / MANIFEST).read_text())
    assert manifest["report_date"] == "2026-11-29"
    record = json.loads((published.folder / "decision.json").read_text())
    ages = {k: v for k, v in record["measurements"].items() if "age_days" in k and v is not None}
    # The catalog ages by the oldest fact used: llama.cpp's long-context support (the sample's
    # prompts need it), resting on a pull request of 2025-12-15, 349 days before the report date.
    assert ages == {"catalog.oldest_fact_age_days": 349, "bench.age_days[vllm]": 389}
    text = " ".join(pdf_text(published.pdf).split())
    assert "Report date 2026-11-29" in text
    # No age below zero (the sensitivity's "−20 points" is a change, not an age).
    assert re.search(r"[-−]\s?\d+ days?\b", text) is None
    assert (
        "run 2025-11-05, 389 days before the report date (older than the 183 days a benchmark "
        "stays current); after the traffic's last day" in text
    )
    assert "as of 2026-12-01, 2 days after the report date: it describes the engines as" in text
    assert "maintenance since 2025-12-11, 353 days before the report date" in text


@pytest.mark.usefixtures("pdf_as_its_html")
def test_without_a_date_the_first_publication_dates_the_version(
    bundled: Bundle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No bench.as_of: the clock on the day v1 is published dates it; its manifest keeps the
    date, so the next run (months later, nothing changed) publishes nothing and re-rendering v1
    gives the same bytes."""
    shutil.rmtree(bundled.reports)  # the workload's first version is the undated one
    config = edit(bundled.config, bench__as_of=None)
    set_clock(monkeypatch, "2026-12-01")
    first = publish(config, upstream=BENCH_READERS)
    assert json.loads((first.folder / MANIFEST).read_text())["report_date"] == "2026-12-01"
    text = html_text(first)
    assert "2026-12-01 (the day this version was first published)" in text
    assert "run 2025-11-05, 391 days before the report date" in text
    # The bench stage had no date to check the age against; the decision's flags it stale.
    record = json.loads((first.folder / "decision.json").read_text())
    rule = next(r for r in record["rationale"] if r["rule"] == "transferability")
    assert "stale" in rule["evidence"]["flags"]["vllm"]
    set_clock(monkeypatch, "2027-03-15")
    again = publish(config, upstream=BENCH_READERS)
    assert (again.created, again.version) == (False, 1)
    loaded = load_config(config)
    rerender = stage.run(configured_inputs(loaded))
    assert rerender.pdf == first.pdf.read_bytes()


# ----------------------------------------------------------- quarters and the changes


@pytest.mark.usefixtures("pdf_as_its_html")
def test_a_quarter_without_the_traffic_is_refused_unless_allowed(bundled: Bundle) -> None:
    # After 2025-Q1 v1; only the report reads report.*
    with pytest.raises(ConfigError, match=r"report.quarter: 2024-Q4 holds none of the traffic"):
        publish(bundled.workload(quarter="2024-Q4"), upstream=())
    allowed = publish(bundled.workload(quarter="2024-Q4", allow_other_quarter=True), upstream=())
    assert (allowed.quarter, allowed.version) == ("2024-Q4", 1)
    text = html_text(allowed)
    assert "Compared with 2025-Q1 v1." in text  # not "the first version for this workload"
    assert "filed under 2024-Q4 (report.allow_other_quarter); the traffic is from 2025-Q1" in text


@pytest.mark.usefixtures("pdf_as_its_html")
def test_a_price_change_lists_that_key_and_the_numbers_it_moved(bundled: Bundle) -> None:
    """H100 $3.0 → $3.5 an hour: the configuration change is that one key; the benchmark's
    cost per 1M output tokens, $ ÷ (92.2241 req/s × 62.3254 tokens × 3600 s) × 10⁶, moves from
    $0.1450 to $0.1691 and its monthly fleet from $2,190 to $2,555 (1 GPU × 730 h); this
    workload's figures move with the price too (same fleet, 23 GPUs); no input file is "added"
    (upstream outputs that moved are "changed")."""
    config = bundled.config  # 2025-Q1 v1 at $3.0
    raw = yaml.safe_load(config.read_text())
    raw["bench"]["prices"]["gpu_hour_usd"]["H100"] = 3.5
    config.write_text(yaml.safe_dump(raw))
    second = publish(config, upstream=BENCH_READERS)
    assert (second.created, second.version) == (True, 2)
    loaded = load_config(config)
    changes = build(configured_inputs(loaded).document).changes
    assert changes.against == "2025-Q1 v1"
    assert [c.model_dump() for c in changes.configuration] == [
        {"key": "bench.prices.gpu_hour_usd.H100", "before": "3.0", "now": "3.5"}
    ]
    assert {i.change for i in changes.inputs} == {"changed"}
    # Besides upstream outputs, the one input file that changed is the configuration itself.
    read = {i.path for i in changes.inputs if not i.path.startswith("derived:")}
    assert read == {f"config:{config.name}"}
    # This workload's own figures scale with the GPU price on the same 23-GPU fleet: $10.5088 ×
    # 3.5 ÷ 3 = $12.2603 per 1M output tokens; 23 × $3.5 × 730 h = $58,765 a month plus the
    # unchanged $200 of model changes; the routing layer's saving is GPU time, so × 3.5 ÷ 3 too.
    assert {n.what: (n.before, n.now) for n in changes.numbers} == {
        "benchmark's own $ per 1M output tokens, vLLM": ("$0.1450", "$0.1691"),
        "benchmark's own monthly GPU cost, vLLM": ("$2,190", "$2,555"),
        "$ per 1M output tokens at the SLO, vLLM": ("$10.5088", "$12.2603"),
        "monthly cost, vLLM": ("$50,570", "$58,965"),
        "monthly value of prefix-aware routing": ("$82", "$95"),
    }
    text = html_text(second)
    assert "bench.prices.gpu_hour_usd.H100 3.0 3.5" in text


def test_configuration_changes_name_nested_keys() -> None:
    before = {"bench": {"prices": {"gpu_hour_usd": {"H100": 3.0}}, "as_of": None}, "a": [1]}
    now = {"bench": {"prices": {"gpu_hour_usd": {"H100": 3.5, "L40S": 1.2}}, "as_of": None}}
    assert [c.model_dump() for c in configuration_changes(before, now)] == [
        {"key": "a", "before": "[1]", "now": "not set"},
        {"key": "bench.prices.gpu_hour_usd.H100", "before": "3.0", "now": "3.5"},
        {"key": "bench.prices.gpu_hour_usd.L40S", "before": "not set", "now": "1.2"},
    ]
