"""Deterministic SVG figures in one style, without pyplot's global state.

:func:`drawing` makes a Matplotlib figure (Agg, no pyplot); :func:`svg_bytes` saves it with a
fixed id salt and no date, so the same data always gives the same bytes. Text is kept as text
in DejaVu Sans (one ``<text>`` element per line, not a path per glyph): the PDF lays it out in the
bundled DejaVu Sans (the stylesheet's @font-face), so it reads and prints as Matplotlib measured
it, stays selectable, and the document renders several times faster; a browser without DejaVu
Sans falls back to its own sans-serif. The markers and line styles (not only colours) tell
series apart so the figures stay readable in greyscale. Matplotlib is imported when the first figure is drawn, so a
command that draws none (``enginefit simulate TRACE``) does not pay for it.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from matplotlib.path import Path

#: Dots per inch of a dense layer a figure rasterises (``rasterized=True``): too many vertices
#: to paint as vector, and finer than print shows. Everything else stays vector.
RASTER_DPI = 300
STYLE: Any = {
    "svg.hashsalt": "enginefit",
    "svg.fonttype": "none",
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    # The resolution of the few layers drawn as an image (``rasterized=True``), print quality.
    "savefig.dpi": RASTER_DPI,
}
#: The smallest text a figure draws (legends, notes). The widest figure is MAX_WIDTH_IN inches,
#: printed at the A4 column's 176 mm, so this prints at ≥ 7 pt (8 × 176 ÷ (7.5 × 25.4) = 7.4).
SMALL_FONT = 8
MAX_WIDTH_IN = 7.5
# Colour-blind-safe palette (Okabe-Ito) with distinct markers and dashes for greyscale print.
COLORS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", "-.", ":")


@contextmanager
def drawing(width: float = 7.0, height: float = 4.0) -> Iterator[Figure]:
    """A new figure, drawn in the enginefit style inside the ``with`` block::

    with drawing(7, 4) as fig:
        ax = fig.subplots()
        ...
        return svg_bytes(fig)
    """
    import matplotlib  # import here: matplotlib is heavy; only commands that draw load it

    matplotlib.use("Agg")
    from matplotlib.figure import Figure  # import here: after choosing the Agg backend

    if width > MAX_WIDTH_IN:
        raise ValueError(f"a figure {width} in wide prints its small text below 7 pt")
    # Matplotlib's scales and tick steps overflow on an extreme (if valid) value, e.g. a load
    # of 1e308 req/s, and numpy would print each overflow on stderr; the figure still draws.
    with matplotlib.rc_context(STYLE), np.errstate(all="ignore"):
        yield Figure(figsize=(width, height))


def svg_bytes(fig: Figure) -> bytes:
    """The figure as SVG bytes: fixed element ids, no timestamp (byte-identical reruns)."""
    import matplotlib  # import here: matplotlib is heavy; only commands that draw load it

    buffer = io.BytesIO()
    with matplotlib.rc_context(STYLE), np.errstate(all="ignore"):
        fig.savefig(
            buffer,
            format="svg",
            metadata={"Date": None},
            bbox_inches="tight",
        )
    return buffer.getvalue()


def cells_path(xs: Sequence[float], ys: Sequence[float], chosen: Sequence[Sequence[bool]]) -> Path:
    """The cells of a grid where ``chosen[j][i]`` holds, as one path (a rectangle per run of
    chosen cells along a row), to fill with one patch: the SVG then holds one element per
    colour instead of one per cell. Cell ``(i, j)`` spans ``xs[i]..xs[i+1]`` by
    ``ys[j]..ys[j+1]``."""
    from matplotlib.path import Path  # import here: matplotlib is heavy; only drawing loads it

    vertices: list[tuple[float, float]] = []
    for j, row in enumerate(chosen):
        i = 0
        while i < len(row):
            if not row[i]:
                i += 1
                continue
            start = i
            while i < len(row) and row[i]:
                i += 1
            left, right, bottom, top = xs[start], xs[i], ys[j], ys[j + 1]
            vertices += [(left, bottom), (right, bottom), (right, top), (left, top), (0.0, 0.0)]
    codes = [Path.MOVETO, Path.LINETO, Path.LINETO, Path.LINETO, Path.CLOSEPOLY]
    return Path(np.array(vertices, dtype=float).reshape(-1, 2), codes * (len(vertices) // 5))
