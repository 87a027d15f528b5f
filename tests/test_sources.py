"""Citations: the product cites only its own documents (at a heading that exists) and upstream
URLs, never the team's notes outside the repository; the selection document's sources list holds
exactly what its text cites."""

from __future__ import annotations

import json
import re
from pathlib import Path

from assets.report import configured_inputs
from pipeline.config import load_config
from pipeline.ledger import HTML
from pipeline.report.compute import build
from pipeline.sources import CITE, cited_sources, cites_in, split_cite
from tests.bundled_report import Bundle, pdf_text
from tests.conftest import REPO

# The team's notes that are not in the repository (spelled so this file does not cite them).
NOTES = (
    "DOMAIN" + ".md",
    "ENGINE_FACTS",
    "SIM_" + "ANCHORS",
    "BENCH_" + "FORMATS",
    "SERVING_MODEL_" + "ANCHORS",
    "STYLE_" + "ANCHORS",
    "ARCHITECTURE" + ".md",
)
PRODUCT = ("pipeline", "assets", "templates", "docs", "tests", "perf")
PRODUCT_FILES = ("README.md", "enginefit.yaml")
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".j2", ".css", ".html", ".toml", ".txt"}
# A relative link between the docs, e.g. ``[…](decision-rules.md#kv-cache-sizing)``.
RELATIVE_LINK = re.compile(r"\]\(([\w.-]+\.md)#([\w-]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")


def product_files() -> list[Path]:
    files = [REPO / name for name in PRODUCT_FILES]
    for folder in PRODUCT:
        files += [p for p in (REPO / folder).rglob("*") if p.suffix in TEXT_SUFFIXES]
    return sorted(p for p in files if p.is_file() and p != Path(__file__))


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation (backticks, slashes, dots,
    question marks, parentheses) dropped, letters, digits, ``-`` and ``_`` kept, spaces to ``-``."""
    kept = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return kept.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    """Every heading anchor of a Markdown file (a repeated heading gets ``-1``, ``-2`` …)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else HEADING.match(line)
        if match:
            base = github_anchor(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def missing_anchors(cites: set[str]) -> list[str]:
    """The ``docs/<file>.md#<anchor>`` cites whose file or heading does not exist."""
    missing = []
    for cite in sorted(cites):
        path, _, anchor = cite.partition("#")
        if not path.startswith("docs/"):
            continue
        doc = REPO / path
        if not doc.is_file() or (anchor and anchor not in anchors(doc)):
            missing.append(cite)
    return missing


def test_the_anchor_rule_is_githubs() -> None:
    assert github_anchor("Did the server keep up? (`pipeline/bench/keepup.py`)") == (
        "did-the-server-keep-up-pipelinebenchkeepuppy"
    )
    assert github_anchor("Routing priced by the model (`compute.routing_value`)") == (
        "routing-priced-by-the-model-computerouting_value"
    )
    assert github_anchor("KV-cache sizing") == "kv-cache-sizing"
    rules = anchors(REPO / "docs" / "decision-rules.md")
    assert {"hardware", "model-churn", "prefix-sharing", "kv-cache-sizing", "keep-up"} <= rules
    assert missing_anchors({"docs/decision-rules.md#no-such-rule"}) == [
        "docs/decision-rules.md#no-such-rule"
    ]
    assert missing_anchors({"docs/no-such-doc.md"}) == ["docs/no-such-doc.md"]


def test_cites_are_found_and_split() -> None:
    text = (
        "see docs/decision-rules.md#hardware and https://arxiv.org/abs/2309.06180. "
        "Also (docs/capacity.md)."
    )
    assert cites_in(text) == [
        "docs/decision-rules.md#hardware",
        "https://arxiv.org/abs/2309.06180",
        "docs/capacity.md",
    ]
    assert split_cite("docs/decision-rules.md#tie: the top two: within the margin") == (
        "docs/decision-rules.md#tie",
        "the top two: within the margin",
    )
    assert split_cite("flip: vLLM wins if …") == (None, "flip: vLLM wins if …")
    assert cited_sources({"a": ["x https://b.example/c", "data:image/svg+xml;https://w3.org"]}) == [
        "https://b.example/c"
    ]


def test_no_product_file_cites_the_team_notes() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{number}"
        for path in product_files()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if any(note in line for note in NOTES)
    ]
    assert offenders == []


def test_every_cited_doc_heading_exists() -> None:
    cites: set[str] = set()
    for path in product_files():
        text = path.read_text(encoding="utf-8")
        cites |= {c for c in cites_in(text) if c.startswith("docs/")}
        if path.parent == REPO / "docs":
            cites |= {f"docs/{file}#{anchor}" for file, anchor in RELATIVE_LINK.findall(text)}
    assert "docs/decision-rules.md#kv-cache-sizing" in cites  # the scan sees the code's cites
    assert missing_anchors(cites) == []


def test_the_bundled_record_and_document_cite_only_what_they_list(bundled: Bundle) -> None:
    config_path, published = bundled.config, bundled.first
    record = json.loads((published.folder / "decision.json").read_text())
    # Every rule cites its section of docs/decision-rules.md, and nothing else.
    sources = {r["rule"]: r["source"] for r in record["rationale"]}
    assert sources["hardware"] == "docs/decision-rules.md#hardware"
    assert sources["model_churn"] == "docs/decision-rules.md#model-churn"
    assert sources["isolation"] == "docs/decision-rules.md#isolation"
    assert all(
        CITE.fullmatch(s) and s.startswith("docs/decision-rules.md#") for s in sources.values()
    ), sources
    trigger_cites = {split_cite(t["why"])[0] for t in record["triggers"]} - {None}
    assert "docs/decision-rules.md#concurrency" in trigger_cites
    record_text = json.dumps(record, ensure_ascii=False)
    assert not any(note in record_text for note in NOTES)
    assert missing_anchors(set(cites_in(record_text))) == []
    # The sources list is every cite of the text, each a repository doc or a URL.
    config = load_config(config_path)
    document = build(configured_inputs(config).document)
    listed = document.appendix.sources
    text = document.model_dump(exclude={"appendix"})
    cited = set(cites_in(json.dumps(text, ensure_ascii=False)))
    assert set(listed) == cited and "docs/decision-rules.md#kv-cache-sizing" in listed
    assert all(s.startswith("docs/") or s.startswith("https://") for s in listed)
    assert missing_anchors(set(listed)) == []
    html = (published.folder / HTML).read_text(encoding="utf-8")
    section = html[html.index("<h2>Sources</h2>") :]
    assert all(s in section.split("</p>")[1] for s in listed)  # the list after the note
    pdf = pdf_text(published.pdf)
    assert not any(note in pdf for note in NOTES)
    assert "docs/decision-rules.md#hardware" in pdf
