"""What the multiprocess executor's fork server imports once, before it forks a process per step.

Started fresh, a step's process spends seconds importing Dagster, polars, numba, the
definitions and the instance's storage (SQLite, or PostgreSQL through dagster-postgres) before
its step begins; forked from a server that imported them already, it starts at once (README,
"Scale", has the measurements). Nothing here opens a file or a connection that a fork
would share: the instance is opened (its storage modules imported) and closed again.
"""

from __future__ import annotations

import os

import dagster as dg

import assets.definitions  # noqa: F401  (imported for its side effect: the definitions loaded)
from assets.progress import drop_storage_echoes

drop_storage_echoes()

if os.environ.get("DAGSTER_HOME"):
    with dg.DagsterInstance.get():
        pass
