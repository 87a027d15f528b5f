"""Presentation shared by the command line, the Dagster metadata and the PDF: tables and figures.

:mod:`pipeline.present.tables` renders rows as Markdown (one cell format for every number);
:mod:`pipeline.present.figures` makes deterministic SVG figures in one style.
"""
