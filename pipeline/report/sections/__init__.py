"""The selection document, one module per section, each a frozen model built by a pure function
from the typed stage results (:class:`~pipeline.report.sections.content.ReportContent`):
``memo`` (page 1), ``dates``, ``summary`` (1), ``whatif`` (1), ``requirements`` (2), ``shape``
(3), ``prefix`` (4), ``bench`` and ``workload_cost`` (5), ``catalog`` (6), ``rationale`` (7),
``triggers`` (8), ``changes`` (9), ``workings`` and ``appendix`` (10).
"""
