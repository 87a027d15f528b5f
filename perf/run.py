"""``make bench``: measure enginefit's own speed. Runs every module of this folder in turn
(each prints its own results); ``python -m perf.run sim shape`` runs the ones named.

This folder measures the code's performance; the benchmark *results* the pipeline analyses are
``bench-results/`` (inputs) and the bench stage (``pipeline/bench``).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

MODULES = (
    "ingest",
    "trace_readers",
    "result_readers",
    "shape",
    "prefix",
    "sim",
    "capacity",
    "whatif",
    "loadtest",
    "graph",
    "e2e",
)


def main() -> int:
    present = {p.stem for p in Path(__file__).parent.glob("*.py")}
    selected = [m for m in MODULES if m in present and (not sys.argv[1:] or m in sys.argv[1:])]
    for name in selected:
        print(f"== {name} ==", flush=True)
        importlib.import_module(f"perf.{name}").main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
