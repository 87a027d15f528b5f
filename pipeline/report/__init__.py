"""The selection report: the decision and the stages' results as a versioned PDF and HTML
document with its manifest and ledger.

The stage shape with one file less: no ``checks.py``, because a published version is checked
by ``enginefit audit`` (``audit``, every hash against its manifest), not by asset checks over
a result. ``compute`` builds the document's content, ``present`` renders it (HTML, PDF).
Beside it: ``versions`` (the version folders and ledger), ``headline`` (one line per stage).
"""
