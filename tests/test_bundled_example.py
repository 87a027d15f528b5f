"""The bundled example shows the product: page 1 of its report prices the engines it can, and
the README opens on that page."""

from __future__ import annotations

import io
import json
import re

import pypdf
from PIL import Image

from tests.bundled_report import Bundle
from tests.conftest import REPO

# A row of page 1's cost table: the engine, its monthly cost with its band (where the capacity
# has one), its cost per 1M output tokens.
PRICED_ROW = re.compile(
    r"^(?P<engine>.+?) \$(?P<monthly>[\d,]+)"
    r"(?:\s+\(band\s+\$(?P<low>[\d,]+)–\$(?P<high>[\d,]+)\))?\s+\$(?P<per_1m>[\d.]+)",
    re.M,
)


def test_page_one_prices_every_engine_the_record_prices(bundled: Bundle) -> None:
    published = bundled.first
    first = pypdf.PdfReader(io.BytesIO(published.pdf.read_bytes())).pages[0].extract_text()
    rows = {
        m["engine"]: (m["monthly"], m["low"], m["high"], m["per_1m"])
        for m in PRICED_ROW.finditer(first)
    }
    record = json.loads((published.folder / "decision.json").read_text())
    priced = {
        c["engine"]: c
        for c in record["candidates"]
        if c["cost_per_1m_output_usd"] is not None and c["monthly_cost_usd"] is not None
    }
    # vLLM's sweep carried to the trace at MLPerf's long-context SLO: 23 H100s at $3 × 730 h
    # plus 2 model changes a quarter (tests/test_decision_cli.py works the fleet by hand).
    assert set(priced) == {"vllm"}
    # Its band: 15 to 35 replicas over the capacity band (the fit's residuals with the
    # validation error, docs/capacity.md), the model changes added to both ends.
    assert rows == {"vLLM": ("50,570", "33,050", "76,850", "10.5088")}, first
    assert round(priced["vllm"]["cost_per_1m_output_usd"], 4) == 10.5088
    # Every other engine on the page says it has no cost rather than showing one.
    assert re.search(r"^SGLang unknown unknown", first, re.M)


def test_the_readme_opens_on_page_one() -> None:
    readme = (REPO / "README.md").read_text()
    first_screen = readme[: readme.index("\n## ")]
    assert '<img src="docs/report-page1.png"' in first_screen
    assert "docs/bundled-example.md" in first_screen
    with Image.open(REPO / "docs" / "report-page1.png") as page:
        # An A4 page (210 × 297 mm), portrait.
        assert page.format == "PNG" and abs(page.height / page.width - 297 / 210) < 0.01
