"""What the multiprocess executor's fork server imports once, before it forks a process per step.

Started fresh, a step's process spends about 2 s importing Dagster, polars, numba and the
definitions and 0.7 s more importing the instance's storage (SQLite, or PostgreSQL through
dagster-postgres) before its step begins. Forked from a server that imported them already, it
starts in about 0.2 s (README, "Scale"). Nothing here opens a file or a connection that a fork
would share: the instance is opened (its storage modules imported) and closed again.
"""

from __future__ import annotations

import os

import dagster as dg

import assets.definitions  # noqa: F401  (imported for its side effect: the definitions loaded)

if os.environ.get("DAGSTER_HOME"):
    with dg.DagsterInstance.get():
        pass
