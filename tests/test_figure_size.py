"""The document's figures stay cheap to paint: a bounded number of SVG elements per figure,
text as text (no glyph outlines), and that text still printed in the PDF."""

from __future__ import annotations

import base64
import re
from xml.etree import ElementTree

import numpy as np
import pypdfium2 as pdfium
from matplotlib.path import Path as MplPath

from pipeline.ledger import HTML
from pipeline.present.figures import cells_path
from tests.bundled_report import Bundle

# The most elements one figure of the bundled document may hold. The largest hold about 420
# (the two latency panels; the hit-ratio plot with its log axis's minor ticks); when the text
# was drawn as one path per glyph and the decision map as one shape per cell, they held 325 to
# 1,430.
MAX_NODES_PER_FIGURE = 450
FIGURES_IN_THE_BUNDLED_DOCUMENT = 8


def _figures(html: str) -> list[bytes]:
    return [
        base64.b64decode(uri)
        for uri in re.findall(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', html)
    ]


def test_each_figure_of_the_bundled_document_is_small(bundled: Bundle) -> None:
    figures = _figures((bundled.first.folder / HTML).read_text())
    assert len(figures) == FIGURES_IN_THE_BUNDLED_DOCUMENT
    for svg in figures:
        root = ElementTree.fromstring(svg)
        nodes = sum(1 for _ in root.iter())
        assert nodes <= MAX_NODES_PER_FIGURE, (nodes, svg[:2000])
        # Text is kept as text: no glyph outline is defined, and the strings are elements.
        assert b'id="DejaVuSans-' not in svg
        assert any(e.text for e in root.iter("{http://www.w3.org/2000/svg}text"))


def test_the_figures_text_is_printed_in_the_pdf(bundled: Bundle) -> None:
    html = (bundled.first.folder / HTML).read_text()
    # pypdfium2, not pypdf: pypdf joins the words of SVG text (placed glyph by glyph).
    document = pdfium.PdfDocument(bundled.first.pdf)
    text = " ".join(page.get_textpage().get_text_range() for page in document)
    # Axis labels that only the figures write (the prose never does).
    for label in ("prefix-cache capacity per replica (tokens)", "token load imbalance"):
        assert label not in re.sub(r'src="data:[^"]*"', "", html), label
        assert label in " ".join(text.split()), label


def test_cells_path_is_one_rectangle_per_run_along_a_row() -> None:
    xs, ys = [0.0, 1.0, 2.0, 4.0], [10.0, 20.0, 30.0]
    path = cells_path(xs, ys, [[True, True, False], [True, False, True]])
    # Row 0: cells 0..1 as one run; row 1: cell 0 and cell 2 apart.
    rectangles = [
        [(0, 10), (2, 10), (2, 20), (0, 20)],
        [(0, 20), (1, 20), (1, 30), (0, 30)],
        [(2, 20), (4, 20), (4, 30), (2, 30)],
    ]
    vertices = path.vertices.reshape(-1, 5, 2)[:, :4].tolist()
    assert vertices == [[list(map(float, v)) for v in r] for r in rectangles]
    codes = [MplPath.MOVETO, MplPath.LINETO, MplPath.LINETO, MplPath.LINETO, MplPath.CLOSEPOLY]
    assert path.codes is not None and path.codes.tolist() == codes * 3
    nothing = cells_path(xs, ys, [[False] * 3, [False] * 3])
    assert nothing.vertices.shape == (0, 2) and np.size(nothing.codes) == 0
