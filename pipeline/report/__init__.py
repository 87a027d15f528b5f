"""The selection report: the decision and the stages' results as a versioned PDF and HTML
document with its manifest and ledger.

The stage shape with one file less: no ``checks.py``, because a published version is checked
by ``enginefit audit`` (``audit``: the ledger, the signature, every hash against the
manifest), not by asset checks over a result. ``compute`` builds the document's content,
``present`` renders it (HTML, PDF). Beside it: ``versions`` (the version folders and the
ledger's hash chain), ``signing`` (the optional ``ssh-keygen`` signature of each manifest),
``headline`` (one line per stage).
"""
