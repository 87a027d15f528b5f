"""The selection document as HTML (jinja2) and PDF (WeasyPrint), from ``templates/``.

Safety: Jinja autoescapes every value and fails on an undefined one; WeasyPrint fetches only
``data:`` URIs (the embedded figures) and files inside ``templates/`` (the stylesheet and the
bundled font) — never the network or any other file, whatever a workload name, engine label or
benchmark field contains. Determinism: no clock is read; the PDF carries no creation date.
"""

from __future__ import annotations

import functools
import logging
import mimetypes
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import jinja2
from weasyprint import HTML
from weasyprint.urls import URLFetcher, URLFetcherResponse

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
TEMPLATE = "engine-selection.html.j2"


# One per process: compiling the template is most of what rendering the HTML costs, and a
# publication renders it twice (the standalone file and the PDF's source). Jinja recompiles a
# template whose file changed.
@functools.cache
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render_html(document: dict[str, Any], *, standalone: bool) -> str:
    """The document as HTML. ``standalone`` inlines the stylesheet (the HTML file published
    beside the PDF opens anywhere); the PDF's HTML links it from ``templates/``."""
    css = standalone_css() if standalone else None
    return environment().get_template(TEMPLATE).render(doc=document, inline_css=css)


def standalone_css() -> str:
    """The stylesheet for the published HTML file, which must stand alone: the bundled fonts'
    @font-face rules refer to files that are not beside it, so they are left out and the
    reader's own sans-serif and monospace fonts are used (the PDF embeds the bundled ones)."""
    css = (TEMPLATES / "engine-selection.css").read_text(encoding="utf-8")
    return re.sub(r"@font-face\s*\{[^}]*\}\s*", "", css)


class LocalOnlyFetcher(URLFetcher):  # type: ignore[misc]
    """Serves ``data:`` URIs and files under ``templates/``; refuses everything else (and
    remembers what it refused, for the tests)."""

    def __init__(self) -> None:
        super().__init__(allowed_protocols=("data", "file"), allow_redirects=False)
        self.refused: list[str] = []

    def fetch(self, url: str, headers: Any = None) -> URLFetcherResponse:
        if url.startswith("data:"):
            return super().fetch(url, headers)
        parsed = urlparse(url)
        if parsed.scheme == "file":
            path = Path(unquote(parsed.path)).resolve()
            if path.is_file() and path.is_relative_to(TEMPLATES):
                kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
                return URLFetcherResponse(url, path.read_bytes(), {"Content-Type": kind})
        self.refused.append(url)
        raise ValueError(f"enginefit documents fetch nothing outside templates/: {url}")


@contextmanager
def _fixed_font_timestamps() -> Iterator[None]:
    """fontTools stamps each embedded font subset with the current time unless
    SOURCE_DATE_EPOCH is set (the reproducible-builds convention): pin it while rendering."""
    before = os.environ.get("SOURCE_DATE_EPOCH")
    os.environ["SOURCE_DATE_EPOCH"] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["SOURCE_DATE_EPOCH"]
        else:
            os.environ["SOURCE_DATE_EPOCH"] = before


def render_pdf(html: str, fetcher: LocalOnlyFetcher | None = None) -> bytes:
    """The PDF bytes of ``html`` (relative URLs resolve inside ``templates/``)."""
    fetcher = fetcher or LocalOnlyFetcher()
    # WeasyPrint logs each refused or unsupported resource as a warning; the fetcher keeps the
    # refusals, so the log would only repeat them on the user's terminal.
    logger = logging.getLogger("weasyprint")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with _fixed_font_timestamps():
            document = HTML(string=html, base_url=f"{TEMPLATES.as_uri()}/", url_fetcher=fetcher)
            pdf = document.write_pdf()
    finally:
        logger.setLevel(level)
    assert pdf is not None
    return bytes(pdf)
