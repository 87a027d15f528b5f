"""``make bench``: run every ``benchmarks/bench_*.py`` in turn (each prints its own results)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path


def main() -> int:
    names = sorted(p.stem for p in Path(__file__).parent.glob("bench_*.py"))
    selected = [n for n in names if not sys.argv[1:] or n in sys.argv[1:]]
    for name in selected:
        print(f"== {name} ==", flush=True)
        importlib.import_module(f"benchmarks.{name}").main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
