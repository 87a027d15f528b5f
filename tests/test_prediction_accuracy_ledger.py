"""Predicted against measured in the product: the decision record's measurements, ``enginefit
explain``, the document's capacity section and the ledger, which keeps each version's signed
error so the next version's document shows it quarter over quarter; ``enginefit audit`` checks
the ledger's figure against the record it points to.

The capacity stage's own check is tested in tests/test_capacity_prediction_check.py; here the
capacity result carries a hand-made one (predicted 4.4 against 4.0 measured: +10 %), so every
figure downstream is a hand check.
"""

from __future__ import annotations

import datetime as dt
import json
from functools import cache
from pathlib import Path

import polars as pl
import pytest

from assets.cli import main as enginefit
from assets.report import configured_inputs as report_inputs
from pipeline import results
from pipeline.capacity.compute import prediction_check
from pipeline.capacity.present import prediction_sentence
from pipeline.capacity.result import CapacityResult, PredictionCheck, ServingModel
from pipeline.commands.decision import configured_inputs as decision_inputs
from pipeline.config import Config
from pipeline.decision import measures
from pipeline.decision import stage as decision_stage
from pipeline.decision.present import rationale_text
from pipeline.decision.result import DecisionRecord
from pipeline.ingest.result import IngestSummary
from pipeline.ingest.stage import split_parts
from pipeline.layout import WorkloadLayout
from pipeline.ledger import HTML, LEDGER, PDF, Entry, ReportTree
from pipeline.report import present
from pipeline.report import stage as report_stage
from pipeline.report.audit import audit
from pipeline.report.sections.accuracy import PublishedErrors, prediction_accuracy, published_errors
from pipeline.store import publish_ingest
from pipeline.unknown import Unknown
from tests import decision_fixtures
from tests.bundled_report import pdf_text, render_the_html_as_the_pdf
from tests.capacity_scenarios import fitted
from tests.decision_fixtures import (
    CapacityWriter,
    capacity_of,
    configuration,
    decide_on,
    sweep,
    traffic,
)

NVIDIA = {"deployment": "datacenter", "hardware": ["nvidia"]}
FITTED_FROM = ["vllm 1.0 / m / 1×H100 / synthetic"]
MEASURED_FROM = "vllm 1.0 / loadtest-vllm / m / 1×H100 / w"


@cache
def model() -> ServingModel:
    fit = fitted("short")
    assert isinstance(fit, ServingModel), fit
    return fit


def checked(check: PredictionCheck | Unknown | None) -> CapacityWriter:
    """The capacity stage's stand-in (tests/decision_fixtures.py) with ``check`` on its
    candidate, written where the decision reads it."""
    carry = capacity_of(model())

    def write(layout: WorkloadLayout, cfg: Config) -> CapacityResult:
        result = carry(layout, cfg)
        result = result.model_copy(
            update={
                "candidates": [
                    c.model_copy(update={"prediction_check": check}) for c in result.candidates
                ]
            }
        )
        (layout.root / "capacity" / "capacity.json").write_text(json.dumps(result.to_json()))
        results.CAPACITY.seal(layout)  # as the capacity stage's write does
        return result

    return write


def check_of(predicted: float, measured: float) -> PredictionCheck:
    made = prediction_check(
        predicted, measured, fitted_from=FITTED_FROM, measured_from=MEASURED_FROM
    )
    assert isinstance(made, PredictionCheck)
    return made


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One workload run through every stage once (each test then re-runs only the capacity
    stand-in and the decision, with its own check)."""
    folder = tmp_path_factory.mktemp("accuracy")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decision_fixtures, "write_requests", _with_summary)
        decide_on(
            folder,
            traffic(600, rate_rps=20, e2e_s=1.0, turn_blocks=8),
            [sweep("vllm", 40)],
            NVIDIA,
            capacity=capacity_of(model()),
        )
    # The configuration file a version records (the fixtures build the configuration in code).
    (folder / "enginefit.yaml").write_text("# built in tests/decision_fixtures.py\n")
    return folder


def _with_summary(frame: pl.DataFrame, workload_dir: Path) -> None:
    """The request table published with the ingest summary the report reads (the decision's
    fixtures publish the table alone)."""
    first, last = frame["arrival"].min(), frame["arrival"].max()
    assert isinstance(first, dt.datetime) and isinstance(last, dt.datetime)
    summary = IngestSummary(
        files=[],
        records_read=frame.height,
        ingested=frame.height,
        quarantined=0,
        quarantined_by_reason={},
        out_of_order=0,
        duplicate_timestamps=0,
        duplicate_request_ids=0,
        first_arrival=first.isoformat(),
        last_arrival=last.isoformat(),
        span_s=(last - first).total_seconds(),
        block_size=16,
        tokenizer="counts",
        tokens_approximate=False,
    )
    publish_ingest(WorkloadLayout(workload_dir), split_parts(frame), summary=summary.to_json())


def _config(root: Path) -> Config:
    return configuration(root, NVIDIA, results=[root / "bench-results" / "0-vllm"])


def redecide(root: Path, check: PredictionCheck | Unknown | None) -> DecisionRecord:
    """The capacity stage's stand-in again with ``check`` (None: none), then the decision."""
    cfg = _config(root)
    layout = cfg.layout()
    checked(check)(layout, cfg)
    record = decision_stage.run(decision_inputs(cfg), cfg.requirements, cfg.decision)
    decision_stage.write(record, layout)
    return record


def test_the_record_and_explain_show_predicted_against_measured(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check = check_of(4.4, 4.0)
    record = redecide(root, check)
    m = measures.values(record.measurements)
    assert m["capacity.prediction_error[vllm]"] == pytest.approx(0.1, abs=1e-6)
    assert (m["capacity.predicted_rps[vllm]"], m["capacity.measured_rps[vllm]"]) == (4.4, 4.0)
    sentence = (
        f"predicted 4.4 req/s per replica by the model fitted on {FITTED_FROM[0]} without this "
        f"workload's own traffic; measured 4 req/s on it ({MEASURED_FROM}): error +10.0%"
    )
    assert m["capacity.prediction_check[vllm]"] == sentence == prediction_sentence(check)
    path = root / "data" / "w" / "decision" / "decision.json"
    assert enginefit(["explain", str(path)]) == 0
    words = " ".join(capsys.readouterr().out.split())
    vllm = words.split("- vLLM [")[1].split(" - ")[0]  # the vLLM candidate's lines
    assert sentence in vllm


def test_an_unknown_check_is_unknown_with_its_reason_and_none_adds_nothing(root: Path) -> None:
    record = redecide(root, Unknown(reason="measured: the sweep never failed"))
    m = measures.values(record.measurements)
    assert m["capacity.prediction_error[vllm]"] is None
    assert m["capacity.predicted_rps[vllm]"] is None
    assert m["capacity.prediction_check[vllm]"] == (
        "predicted against measured: unknown — measured: the sweep never failed"
    )
    assert "unknown — measured: the sweep never failed" in " ".join(rationale_text(record).split())
    assert prediction_accuracy(record, [], "2026-Q4", 1) is not None
    # Nothing load-tested: nothing in the record, and no section unless the ledger has history.
    record = redecide(root, None)
    assert not [k for k in record.measurements if "predict" in k]
    assert "predicted" not in rationale_text(record)
    assert prediction_accuracy(record, [], "2026-Q4", 1) is None
    shown = prediction_accuracy(
        record, [PublishedErrors("2026-Q3", 1, {"vllm": 0.2})], "2026-Q4", 1
    )
    assert shown is not None and shown.rows == []
    assert [v.model_dump() for v in shown.history] == [
        {"version": "2026-Q3 v1", "errors": ["+20.0%"]},
        {"version": "2026-Q4 v1 (this one)", "errors": ["—"]},
    ]


def _publish(root: Path) -> Path:
    cfg = _config(root)
    published = report_stage.publish(report_inputs(cfg), cfg.filing().tree, cfg.report)
    assert published.created
    return published.folder


def test_the_ledger_keeps_the_error_and_the_document_shows_it_version_by_version(
    root: Path,
) -> None:
    redecide(root, check_of(4.4, 4.0))
    # The first version's document is read as HTML and audited, never as a PDF (the second's
    # is): a stand-in for its PDF spares a render.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(present, "render_pdf", render_the_html_as_the_pdf)
        first = _publish(root)
    redecide(root, check_of(3.6, 4.0))
    second = _publish(root)
    tree = ReportTree(first.parent.parent)
    entries = tree.read_ledger()
    assert [e.prediction_errors for e in entries] == [{"vllm": 0.1}, {"vllm": -0.1}]
    quarter = entries[0].quarter
    html = (second / HTML).read_text()
    text = " ".join(html.split())
    assert "<h2>Predicted against measured</h2>" in text
    history = text.split("The error, version by version")[1].split("</table>")[0]
    assert (
        f'<tr><td>{quarter} v1</td><td class="num">+10.0%</td></tr>'
        f'<tr><td>{quarter} v2 (this one)</td><td class="num">-10.0%</td></tr>' in history
    )
    assert '<th class="num">vLLM</th>' in history
    assert '<td class="num">3.60 req/s</td><td class="num">4.00 req/s</td>' in text
    pdf = " ".join(pdf_text(second / PDF).split())
    assert "Predicted against measured" in pdf and f"{quarter} v1 +10.0%" in pdf
    # Each version's own record holds the figure its ledger entry keeps; the audit agrees.
    for folder in (first, second):
        found = audit(folder)
        assert found.ok, (found.problems, found.differences)

    # An error figure edited in the ledger: the last entry (no later entry to break the chain
    # at), then the first (the chain breaks too).
    raw = json.loads((tree.root / LEDGER).read_text())
    raw["versions"][1]["prediction_errors"]["vllm"] = -0.05
    (tree.root / LEDGER).write_text(json.dumps(raw))
    found = audit(second)
    assert not found.ok and not found.differences
    assert found.problems == [
        f"{tree.ledger}: versions[1].prediction_errors: {{'vllm': -0.05}} is not the capacity "
        "prediction errors of the decision record it points to ({'vllm': -0.1}, its "
        "measurements capacity.prediction_error[…])"
    ]
    raw["versions"][1]["prediction_errors"]["vllm"] = -0.1
    raw["versions"][0]["prediction_errors"] = {"vllm": 0.02}
    (tree.root / LEDGER).write_text(json.dumps(raw))
    problems = audit(first).problems
    assert any("versions[0].prediction_errors: {'vllm': 0.02}" in p for p in problems)
    assert any("the chain breaks at versions[1]" in p for p in problems)


def test_history_is_every_earlier_version_with_errors_in_publication_order() -> None:
    def entry(quarter: str, version: int, errors: dict[str, float | None] | None) -> Entry:
        return Entry(
            quarter, version, f"{quarter}/v{version}", "i", "0" * 64, "h", "t", None, errors
        )

    entries = [
        entry("2026-Q2", 1, {"vllm": 0.12, "sglang": None}),
        entry("2026-Q3", 1, None),
        entry("2026-Q3", 2, {"vllm": -0.04}),
        entry("2026-Q4", 1, {"vllm": 0.5}),
    ]
    assert published_errors(entries, "2026-Q4", 2) == [
        PublishedErrors("2026-Q2", 1, {"vllm": 0.12, "sglang": None}),
        PublishedErrors("2026-Q3", 2, {"vllm": -0.04}),
        PublishedErrors("2026-Q4", 1, {"vllm": 0.5}),
    ]
    # A re-render of 2026-Q3 v2 sees only what was published before it.
    assert published_errors(entries, "2026-Q3", 2) == [
        PublishedErrors("2026-Q2", 1, {"vllm": 0.12, "sglang": None})
    ]
    assert entries[1].as_dict().keys() == {
        "quarter",
        "version",
        "path",
        "identity",
        "manifest_sha256",
        "headline",
        "published_at",
        "previous_sha256",
    }


def test_the_ledger_refuses_an_error_that_is_not_a_number(tmp_path: Path) -> None:
    tree = ReportTree(tmp_path)
    entry = Entry("2026-Q4", 1, "2026-Q4/v1", "i", "0" * 64, "h", "2026-11-29T00:00:00+00:00", None)
    tree.write_ledger([entry])
    raw = json.loads(tree.ledger.read_text())
    raw["versions"][0]["prediction_errors"] = {"vllm": "ten percent"}
    tree.ledger.write_text(json.dumps(raw))
    with pytest.raises(Exception, match=r"versions\[0\]\.prediction_errors: expected an object"):
        tree.read_ledger()
