"""The selection document: rendered from the bundled sample, versioned, audited, safe."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pypdf
import pypdfium2 as pdfium
import pytest
import yaml

from assets.report import configured_inputs
from pipeline.cli import main as enginefit
from pipeline.config import load_config
from pipeline.errors import InputFormatError
from pipeline.ledger import HTML, MANIFEST, ReportTree
from pipeline.present.text import usd
from pipeline.report import signing, stage
from pipeline.report.audit import audit
from pipeline.report.compute import build
from pipeline.report.present import LocalOnlyFetcher, render_pdf
from pipeline.report.result import Published
from tests.bundled_report import Bundle, extracted, html_text, pdf_text, publish, remember
from tests.conftest import (
    REPO,
    _built_once,
    _shared_folder,
    azure_conversation_trace,
    bundled_config,
)

SECTIONS = (
    "1. Executive summary",
    "2. Requirements and SLO",
    "3. Workload shape",
    "4. Prefix sharing, cache and routing",
    "5. Benchmarks",
    "6. Candidates and their mechanisms",
    "7. Decision rationale",
    "8. Revisit triggers",
    "9. Changes since the previous version",
    "10. Appendix: lineage, configuration, versions, sources",
)


#: A page whose last printed line is above this share of its height is near-empty.
MIN_PAGE_FILL = 0.45


def filled_pages(pdf: Path) -> list[int]:
    """The pages (1-based) whose content ends above ``MIN_PAGE_FILL`` of the page between the
    running header and footer: rendered, then the lowest non-white row found."""
    document = pdfium.PdfDocument(pdf)
    short = []
    for number in range(len(document)):
        pixels = np.asarray(document[number].render(scale=0.5).to_pil().convert("L"))
        height = pixels.shape[0]
        body = pixels[int(height * 0.06) : int(height * 0.92)]  # between header and footer
        inked = np.flatnonzero((body < 200).any(axis=1))
        lowest = (inked[-1] if inked.size else 0) / body.shape[0]
        if lowest < MIN_PAGE_FILL:
            short.append(number + 1)
    return short


def test_the_bundled_document_reads_as_a_document(bundled: Bundle) -> None:
    config_path, published = bundled.config, bundled.first
    assert published.created and (published.quarter, published.version) == ("2025-Q1", 1)
    reader = pypdf.PdfReader(published.pdf)
    assert 15 <= len(reader.pages) <= 40
    text = pdf_text(published.pdf)
    for heading in SECTIONS:
        assert heading in text, heading
    assert f"Page 3 of {len(reader.pages)}" in text
    # The executive summary shows the decision record's numbers.
    record = json.loads((published.folder / "decision.json").read_text())
    vllm = next(c for c in record["candidates"] if c["engine"] == "vllm")
    # This workload's cost at the bundled SLO (MLPerf's long-context server constraint), beside
    # the benchmark's own figure.
    assert usd(vllm["cost_per_1m_output_usd"]) == "$10.5088" and "$10.5088" in text
    assert usd(vllm["benchmark_cost_per_1m_output_usd"]) == "$0.1450" and "$0.1450" in text
    assert record["recommendation"]["headline"] in text.replace("\n", " ")
    # Right after the summary: the decision recomputed on the bundled scenarios, and the map.
    requirements = text.index("2. Requirements and SLO\nService-level objective")
    assert text.index("Candidates at the SLO") < text.index("What if: the decision") < requirements
    assert "We are here: vLLM at ×1 today's traffic and 2 model changes a quarter." in text
    assert "traffic-x10 traffic scale 10 vLLM provisional" in text
    config = load_config(config_path)
    summary = build(configured_inputs(config).document).summary
    assert summary.engine == "vLLM" and summary.confidence == "provisional"
    assert [c.engine for c in summary.candidates][:2] == ["vLLM", "SGLang"]
    # Page 1 is the decision memo: what is asked, what each option costs, how sure, what
    # would change it, the next steps.
    first = reader.pages[0].extract_text().replace("\n", " ")
    for heading in (
        "Approve vLLM as the inference engine",
        "What it costs for this traffic",
        "How sure we are",
        "What would change the decision",
        "Next steps",
    ):
        assert heading in first, heading
    assert filled_pages(published.pdf)[:-1] == [], "near-empty pages before the last"
    # The colophon ties a printed copy to its files and ledger entry.
    manifest = json.loads((published.folder / MANIFEST).read_text())
    flat = text.replace("\n", "")
    for digest in (
        manifest["identity"],
        manifest["decision_sha256"],
        hashlib.sha256((published.folder / "decision.json").read_bytes()).hexdigest(),
        manifest["configuration_sha256"],
        next(v for k, v in manifest["inputs"].items() if k.startswith("config:")),
    ):
        assert digest in flat, digest
    # The published HTML stands alone: every url() and src is embedded data, no file beside it.
    html = (published.folder / HTML).read_text()
    assert re.findall(r"url\(\s*[\"']?(?!data:)", html) == []
    assert re.findall(r'(?:src|href)="(?!data:|#)', html) == []
    words = " ".join(text.split())
    assert "no uncommitted changes" in words or "with uncommitted changes" in words
    # Same inputs, same bytes; and the standalone HTML is the same document.
    again = stage.run(configured_inputs(config))
    assert again.pdf == published.pdf.read_bytes()
    assert again.html.encode() == (published.folder / HTML).read_bytes()
    assert "<style>" in again.html and "1. Executive summary" in again.html


@pytest.mark.usefixtures("pdf_as_its_html")
def test_versions_audit_and_an_unchanged_run(
    bundled: Bundle, capsys: pytest.CaptureFixture[str]
) -> None:
    first = bundled.first
    assert first.created
    # Nothing changed: every stage runs again, no new version, and it says which one matches.
    same = publish(bundled.workload())
    assert (same.created, same.version) == (False, 1)
    assert audit(first.folder).ok
    # A changed trace (all but its first 1,031 requests dropped, which the stages run on in a
    # fraction of the time): v2, compared with v1.
    second = publish(bundled.workload(drop_last=11_000))
    assert (second.created, second.version) == (True, 2)
    text = html_text(second)
    assert "Compared with 2025-Q1 v1." in text
    assert "The previous version's triggers, checked now" in text
    record = json.loads((second.folder / "decision.json").read_text())
    assert record["previous"]["as_of"] is not None and record["previous"]["triggers"]
    ledger = json.loads((bundled.reports / "index.json").read_text())
    assert [(v["quarter"], v["version"]) for v in ledger["versions"]] == [
        ("2025-Q1", 1),
        ("2025-Q1", 2),
    ]
    # v1 recorded the full trace, which has since been cut: the audit names it.
    result = audit(first.folder)
    assert not result.ok
    assert [d.path for d in result.differences] == [str(bundled.trace)]
    # The command: exit 1, and the differences as JSON.
    assert enginefit(["audit", str(first.folder), "--json"]) == 1
    printed = json.loads(capsys.readouterr().out)
    assert printed["ok"] is False and printed["checked"] == result.checked
    assert printed["differences"] == [
        {
            "path": str(bundled.trace),
            "expected_sha256": result.differences[0].expected_sha256,
            "actual_sha256": result.differences[0].actual_sha256,
        }
    ]
    assert enginefit(["audit", str(second.folder / "manifest.json")]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("ok: every recorded input")
    # A modified published PDF is caught too, with both hashes.
    pdf = second.pdf
    pdf.write_bytes(pdf.read_bytes() + b"%")
    difference = next(d for d in audit(second.folder).differences if d.path == str(pdf))
    assert difference.actual_sha256 != difference.expected_sha256


@pytest.mark.usefixtures("pdf_as_its_html")
def test_a_crash_before_the_ledger_leaves_it_consistent(
    bundled: Bundle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after the version folder is in place but before its ledger entry: the next run
    finds the complete folder, lists it, and nothing half-written is ever read."""
    root = bundled.reports
    shutil.rmtree(root)  # the stages' outputs stay: the first publication starts again

    def crash(self: ReportTree, entries: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(ReportTree, "write_ledger", crash)
        with pytest.raises(KeyboardInterrupt):
            publish(bundled.config, upstream=())
    assert (root / "2025-Q1" / "v1" / "manifest.json").is_file()
    assert not (root / "index.json").exists()
    assert not [p for p in (root / "2025-Q1").iterdir() if p.name.startswith(".staging-")]
    again = publish(bundled.config, upstream=())  # the recovered v1 is identical: nothing new
    assert (again.created, again.version) == (False, 1)
    ledger = json.loads((root / "index.json").read_text())
    assert [v["version"] for v in ledger["versions"]] == [1]


HOSTILE = '<img src="http://127.0.0.1:9/x">'
#: The bundled sample's hash salt: a secret, which no published file may contain.
SALT = yaml.safe_load((REPO / "enginefit.yaml").read_text())["workload"]["hash_salt"]


@pytest.fixture(scope="session")
def lengths_only(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Published]:
    """An Azure-style trace (lengths only, no prompt content) published once per run as its
    workload's first version, for a team whose name is markup and with the bundled sample's
    salt: its configuration and the version (a real PDF), shared by the xdist workers with the
    PDF's text."""

    def publish_lengths_only(root: Path) -> tuple[Path, Published, dict[str, str]]:
        # A third of the helper's half hour: what the document says of it depends on the
        # trace's kind (lengths only), not its size.
        trace = azure_conversation_trace(root / "azure_conv.csv", n=2000)
        config = bundled_config(root, "azure")
        raw = yaml.safe_load(config.read_text())
        raw["workload"] = {
            "name": "azure-conv",
            "traces": [{"path": str(trace), "format": "azure"}],
            "hash_salt": SALT,
        }
        raw["report"] = {"organisation": HOSTILE}
        config.write_text(yaml.safe_dump(raw))
        published = publish(config)
        return config, published, extracted(published.pdf)

    shared = _shared_folder(tmp_path_factory)
    config, published, texts = _built_once(shared, "lengths-only", publish_lengths_only)
    remember(texts)
    return config, published


def test_a_hostile_name_is_text_and_nothing_is_fetched(
    lengths_only: tuple[Path, Published],
) -> None:
    published = lengths_only[1]  # the workload's first version, under the hostile name
    html = (published.folder / HTML).read_text()
    # No secret travels into the document or its metadata: the salt only as its fingerprint.
    for name in (HTML, MANIFEST, "decision.json"):
        assert SALT not in (published.folder / name).read_text()
    assert SALT not in pdf_text(published.pdf)
    assert HOSTILE not in html and "&lt;img src=&#34;http://127.0.0.1:9/x&#34;&gt;" in html
    assert HOSTILE in pdf_text(published.pdf)
    # The fetcher itself refuses the network and files outside templates/.
    fetcher = LocalOnlyFetcher()
    render_pdf('<img src="http://127.0.0.1:9/x"><img src="file:///etc/passwd"><p>x</p>', fetcher)
    assert fetcher.refused == ["http://127.0.0.1:9/x", "file:///etc/passwd"]


def test_audit_refuses_what_is_not_a_version(tmp_path: Path) -> None:
    with pytest.raises(InputFormatError, match="not a published report version"):
        audit(tmp_path)


@pytest.mark.usefixtures("pdf_as_its_html")
def test_a_new_quarter_compares_with_the_previous_quarter(bundled: Bundle) -> None:
    shutil.rmtree(bundled.data / "decision")  # after 2025-Q1 v1
    # The traffic is 2025-Q1's: filing it under 2025-Q2 has to be meant.
    q2 = publish(bundled.workload(quarter="2025-Q2", allow_other_quarter=True), upstream=())
    assert (q2.quarter, q2.version, q2.created) == ("2025-Q2", 1, True)
    assert "Compared with 2025-Q1 v1." in html_text(q2)


def test_a_trace_without_prompt_content_says_so_instead_of_empty_plots(
    lengths_only: tuple[Path, Published],
) -> None:
    """An Azure-style trace (lengths only): the prefix section says sharing is unknown and why,
    draws no empty curve, and the document still has no near-empty page."""
    config, published = lengths_only
    text = pdf_text(published.pdf).replace("\n", " ")
    assert "no prompt content (nor prefix hashes)" in text
    assert "Shared-prefix ratio by window" not in text  # no empty curve
    assert filled_pages(published.pdf)[:-1] == []
    # The auditor's appendix: the headline cost's formula, with the numbers put in, gives the
    # record's figure; every input names its source (a file and its short hash, or a key).
    loaded = load_config(config)
    document = build(configured_inputs(loaded).document)
    record = json.loads((published.folder / "decision.json").read_text())
    chosen = next(c for c in record["candidates"] if c["status"] == "recommended")
    cost = next(w for w in document.workings if w.number.endswith("this workload"))
    assert cost.number.startswith(chosen["name"]) and cost.value == usd(
        chosen["cost_per_1m_output_usd"]
    )
    price, gpus, capacity, tokens = re.fullmatch(
        r"\$([\d.]+) × (\d+) GPU ÷ \(([\d.]+) req/s × ([\d.]+) output tokens × 3,600 s\) × 10⁶",
        cost.formula,
    ).groups()  # type: ignore[union-attr]
    redone = float(price) * int(gpus) / (float(capacity) * float(tokens) * 3600) * 1e6
    assert redone == pytest.approx(chosen["cost_per_1m_output_usd"], rel=2e-3)
    digest = record["inputs"]["capacity/capacity.json"][:12]
    assert f"capacity/capacity.json {digest}" in " ".join(cost.inputs)
    assert all(w.inputs for w in document.workings)
    assert "How each headline number was computed" in text


@pytest.mark.usefixtures("pdf_as_its_html")
def test_every_file_a_stage_read_is_audited_and_a_signed_version_verifies(
    bundled: Bundle, capsys: pytest.CaptureFixture[str]
) -> None:
    """The configuration, the catalog and the inference-perf run's config.yaml (which the
    reader opens beside the stage files) are inputs of the version: editing either after
    publication fails the audit naming the file. With a signing key configured, the version's
    manifest is signed and the audit verifies it."""
    bench, config_path, first = bundled.bench, bundled.config, bundled.first
    manifest = json.loads((first.folder / MANIFEST).read_text())
    run_config = bench / "vllm-h100-inference-perf" / "config.yaml"
    assert {
        f"config:{config_path.name}",
        f"bench:{run_config.relative_to(bundled.root)}",
        "bundled:pipeline/decision/engines.yaml",
    } <= set(manifest["inputs"])
    assert str(bundled.root) in manifest["roots"] and str(bench) in manifest["roots"]
    assert enginefit(["audit", str(first.folder)]) == 0
    assert "signature: not signed" in capsys.readouterr().out
    for edited in (config_path, run_config):
        before = edited.read_bytes()
        edited.write_bytes(before + b"# edited after publication\n")
        assert enginefit(["audit", str(first.folder)]) == 1
        differs = [x for x in capsys.readouterr().out.splitlines() if x.startswith("DIFFERS")]
        assert len(differs) == 1 and differs[0].startswith(f"DIFFERS {edited}: recorded")
        edited.write_bytes(before)
    # Signed: a new version (the configuration changed), its signature verified.
    keygen = signing.ssh_keygen()
    if keygen is None:
        pytest.skip("ssh-keygen (OpenSSH 8.1+) is not installed: signing untested")
    key = bundled.root / "keys" / "id_ed25519"
    key.parent.mkdir()
    subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    public = key.with_suffix(".pub").read_text().split()
    signers = bundled.root / "keys" / "allowed_signers"
    signers.write_text(f'team@example.com namespaces="enginefit-report" {public[0]} {public[1]}\n')
    raw = yaml.safe_load(config_path.read_text())
    raw["report"] = {"signing_key": str(key), "allowed_signers": str(signers)}
    config_path.write_text(yaml.safe_dump(raw))
    second = publish(config_path, upstream=())
    assert (second.created, second.version) == (True, 2)
    assert (second.folder / "manifest.json.sig").is_file()
    inputs = json.loads((second.folder / MANIFEST).read_text())["inputs"]
    assert f"signers:{signers.relative_to(bundled.root)}" in inputs  # the key itself: never
    assert not [k for k in inputs if "id_ed25519" in k]
    assert enginefit(["audit", str(second.folder), "--allowed-signers", str(signers)]) == 0
    out = capsys.readouterr().out
    assert (
        f"signature: verified: signed by team@example.com (your allowed signers {signers})" in out
    )
