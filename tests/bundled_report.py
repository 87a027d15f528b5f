"""The bundled workload published as the graph publishes it, once per test session.

Rendering a version is most of what a report test costs (the upstream stages, the what-if map and
above all the PDF), so the tests that start from the bundled sample's first version share one:
``conftest.bundled`` publishes it the first time a test asks and hands each test a fresh copy of
the published tree, restored where it was published (a manifest records absolute paths), so a
test may edit the trace, the configuration, the benchmark folder or the version itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import html.parser
import io
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pypdf
import yaml

from assets.report import configured_inputs
from pipeline.cli import main as enginefit
from pipeline.commands.decision import configured_inputs as decision_configured_inputs
from pipeline.commands.whatif import configured_inputs as whatif_configured_inputs
from pipeline.config import load_config
from pipeline.decision import stage as decision_stage
from pipeline.ledger import HTML
from pipeline.report import stage
from pipeline.report.result import Published
from pipeline.whatif import stage as whatif_stage
from tests.conftest import REPO, bundled_config

# The stages the report reads, as their commands write them (the same files as the assets:
# tests/test_stage_identity.py). The Dagster path is tested by test_full_graph/test_decision_cli.
UPSTREAM_COMMANDS = ("ingest", "shape", "prefix", "simulate", "bench", "capacity")
TRACE = REPO / "traces" / "mooncake" / "conversation_trace.jsonl"
WORKLOAD = "mooncake-conversation"


def workload(
    root: Path,
    name: str = "w",
    *,
    drop_last: int = 0,
    bench_results: Path | None = None,
    report: dict[str, object] | None = None,
) -> Path:
    """The bundled configuration on a private copy of the Mooncake trace (optionally without
    its last ``drop_last`` requests), reading ``bench_results`` when given, with this
    ``report`` section."""
    trace = root / "trace.jsonl"
    lines = TRACE.read_text().splitlines()
    trace.write_text("\n".join(lines[: len(lines) - drop_last]) + "\n")
    config = bundled_config(root, name)
    raw = yaml.safe_load(config.read_text())
    raw["workload"]["traces"] = [{"path": str(trace), "format": "auto"}]
    if bench_results is not None:
        raw["bench"]["results"] = [str(bench_results)]
    raw["report"] = report or {}
    config.write_text(yaml.safe_dump(raw))
    return config


def publish(config_path: Path, upstream: Sequence[str] = UPSTREAM_COMMANDS) -> Published:
    """What the graph does: the ``upstream`` stages' commands (every one unless the test
    changed only what some of them read), the decision, the what-if map, the report.

    No ``upstream`` says the test changed only what the report reads (``report.*``, the
    published versions): the decision runs again, as it reads the published versions, but the
    what-if map, which reads neither, is the one already written (the same bytes again)."""
    for command in upstream:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert enginefit([command, "--config", str(config_path)]) == 0, command
    config = load_config(config_path)
    layout = config.layout()
    record = decision_stage.run(
        decision_configured_inputs(config), config.requirements, config.decision
    )
    decision_stage.write(record, layout)
    if upstream:
        whatif = whatif_stage.run(whatif_configured_inputs(config), config.whatif)
        whatif_stage.write(whatif, layout)
    return stage.publish(configured_inputs(config), config.filing().tree, config.report)


# One extraction per distinct document: pypdf takes seconds per version, and several tests
# read the same one.
_TEXTS: dict[str, str] = {}


def pdf_text(path: Path) -> str:
    """The PDF's text, page after page (pypdf)."""
    pdf = path.read_bytes()
    digest = hashlib.sha256(pdf).hexdigest()
    if digest not in _TEXTS:
        pages = pypdf.PdfReader(io.BytesIO(pdf)).pages
        _TEXTS[digest] = "\n".join(page.extract_text() for page in pages)
    return _TEXTS[digest]


def extracted(path: Path) -> dict[str, str]:
    """The PDF's text by the PDF's sha256: what a fixture built once per run hands every
    worker with the version it published (:func:`remember`), so each extracts none."""
    text = pdf_text(path)
    return {hashlib.sha256(path.read_bytes()).hexdigest(): text}


def remember(texts: dict[str, str]) -> None:
    """What :func:`pdf_text` returns for these PDFs (their text by their sha256)."""
    _TEXTS.update(texts)


#: What ``conftest.pdf_as_its_html`` publishes instead of rendering: the HTML it was given.
STAND_IN_PDF = b"%stand-in for the PDF of this HTML\n"


def render_the_html_as_the_pdf(document: str, fetcher: object = None) -> bytes:
    """A stand-in for ``present.render_pdf`` that costs nothing: deterministic, different for
    every document, and no PDF (a test reading it as one fails)."""
    return STAND_IN_PDF + document.encode()


# Elements inside a line of text: no break where they start or end.
_INLINE = frozenset({"a", "abbr", "b", "code", "em", "i", "small", "span", "strong", "sub", "sup"})


class _Text(html.parser.HTMLParser):
    """The text a browser shows: tags and embedded styles dropped, entities decoded, a break
    between blocks (cells, paragraphs, headings)."""

    def __init__(self) -> None:
        super().__init__()
        self.chunks: list[str] = []
        self.hidden = 0

    def handle_starttag(self, tag: str, attrs: object) -> None:
        self.hidden += tag in ("style", "script")
        if tag not in _INLINE:
            self.chunks.append("\n")

    def handle_endtag(self, tag: str) -> None:
        self.hidden -= tag in ("style", "script")
        if tag not in _INLINE:
            self.chunks.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.hidden:
            self.chunks.append(data)


def html_text(published: Published) -> str:
    """The published HTML's text, whitespace collapsed: the same document the PDF renders, for
    tests of what a version says rather than of the PDF."""
    parser = _Text()
    parser.feed((published.folder / HTML).read_text())
    return " ".join("".join(parser.chunks).split())


@dataclass(frozen=True)
class Bundle:
    """A workspace holding the bundled sample's first published version: the trace's copy
    ``trace.jsonl``, the benchmark folder's copy ``bench-results/``, the configuration
    ``w.yaml`` and its data and reports under ``w/``."""

    root: Path
    first: Published

    @property
    def config(self) -> Path:
        return self.root / "w.yaml"

    @property
    def trace(self) -> Path:
        return self.root / "trace.jsonl"

    @property
    def bench(self) -> Path:
        return self.root / "bench-results"

    @property
    def data(self) -> Path:
        return self.root / "w" / "data" / WORKLOAD

    @property
    def reports(self) -> Path:
        return self.root / "w" / "reports" / WORKLOAD

    def workload(self, *, drop_last: int = 0, **report: object) -> Path:
        """This workspace's configuration rewritten (``workload``) with these changes."""
        return workload(self.root, drop_last=drop_last, bench_results=self.bench, report=report)


def publish_bundle(root: Path) -> Bundle:
    """The bundled sample's first version, published in ``root``."""
    bench = root / "bench-results"
    shutil.copytree(REPO / "bench-results", bench)
    return Bundle(root, publish(workload(root, bench_results=bench)))
