"""The load test: replay the workload's trace against a serving endpoint and write the results
where the bench stage reads them.

The stage shape with one file less: no ``checks.py``, because a run is not an asset; what it
writes is checked where it is read, by the bench stage's readers, validity and checks. Beside
it: ``plan`` (the sends of each rate), ``client`` (the streaming HTTP client).
"""
