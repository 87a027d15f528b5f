"""The prefix stage alone at scale: ``enginefit prefix --config`` on an ingested generated trace.

For each size the generated Mooncake-form trace (``perf/workload.py``, as :mod:`perf.e2e`
writes it, optionally spread over ``--span-days``) is written and ingested once
(``enginefit ingest --config``, kept under ``--keep DIR`` to rerun); then ``enginefit prefix
--config`` runs in a child process under :mod:`perf.e2e`'s guard, its memory sampled every
50 ms as summed proportional set sizes. Printed per size: wall and CPU seconds, peak memory, the
load average before and after, and where the outputs were copied (``--label`` names them, so two
runs' files can be compared byte for byte). ``--code DIR`` runs the prefix command on another
checkout (e.g. ``git worktree add /tmp/before main``): before and after on the same data.

``--budget-scale F`` multiplies every memory budget of the stage by F (the configuration's
``session_state_budget``, ``curve_hash_budget`` and ``reuse_block_budget``, and the in-memory
limits of the sessions and of the retention ages): at F = 0.1, 1M and 3M requests stand for
10M and 30M with the default budgets, where the generated trace is exact at 10M and bounded
past it, at a size this machine's other work leaves room for.

Run: ``python -m perf.prefix_stage [--requests 1M,3M] [--span-days 91] [--keep DIR]
[--code DIR] [--label NAME] [--memory-limit 5] [--budget-scale F]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perf import workload
from perf.e2e import GIB, Limits, _gib, configuration, generate, run_watched

REPO = Path(__file__).resolve().parents[1]


# The command with the stage's in-memory limits scaled by argv[1] (the rest: enginefit's).
_SCALED = """
import sys
from pipeline.prefix import analysis, reuse
scale = float(sys.argv.pop(1))
analysis.SESSIONS_IN_MEMORY_MAX = int(analysis.SESSIONS_IN_MEMORY_MAX * scale)
reuse.RETENTION_EXACT_MAX = int(reuse.RETENTION_EXACT_MAX * scale)
from pipeline.cli import main
sys.exit(main(sys.argv[1:]))
"""
BUDGETS = ("session_state_budget", "curve_hash_budget", "reuse_block_budget")


def scaled_config(config: Path, scale: float) -> Path:
    """``config`` with the prefix budgets (their defaults) times ``scale``, beside it."""
    from pipeline.settings import default_mapping

    raw = yaml.safe_load(config.read_text())
    defaults = default_mapping()["prefix"]
    raw["prefix"] = {key: int(defaults[key] * scale) for key in BUDGETS}
    path = config.with_name(f"enginefit-budgets-{scale:g}.yaml")
    path.write_text(yaml.safe_dump(raw))
    return path


def enginefit(
    code: Path, root: Path, config: Path, command: str, limits: Limits, scale: float = 1.0
) -> tuple[float, float, int]:
    """``enginefit COMMAND --config CONFIG`` on ``code``'s checkout, watched: wall s, CPU s,
    peak summed memory (bytes)."""
    env = {**os.environ, "PYTHONPATH": str(code), "ENGINEFIT_HASH_SALT": "bench"}
    log = root / f"{command}.log"
    argv = [sys.executable, "-m", "assets.cli", command, "--config", str(config)]
    if scale != 1.0:
        argv[1:3] = ["-c", _SCALED, str(scale)]
        argv[-1] = str(scaled_config(config, scale))
    watched = run_watched(argv, log, env, root, limits)
    if watched.stopped or watched.code != 0:
        raise SystemExit(f"enginefit {command}: {watched.stopped or watched.code}; see {log}")
    return watched.wall_s, watched.cpu_s, watched.peak


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=workload.counts, default=[1_000_000, 3_000_000])
    parser.add_argument("--span-days", type=float, default=None)
    parser.add_argument("--keep", type=Path, help="write here and keep (default: a temp folder)")
    parser.add_argument("--code", type=Path, default=REPO, help="checkout the prefix runs on")
    parser.add_argument("--label", default="run", help="name of the copied outputs")
    parser.add_argument("--memory-limit", type=_gib, default=5 * GIB)
    parser.add_argument("--budget-scale", type=float, default=1.0)
    args = parser.parse_args(argv)
    limits = Limits(args.memory_limit, None, GIB)
    with tempfile.TemporaryDirectory(prefix="enginefit-prefix-stage-") as scratch:
        base = args.keep or Path(scratch)
        for size in args.requests:
            span = f"-{args.span_days:g}d" if args.span_days is not None else ""
            root = base / f"prefix-{size}{span}"
            trace = root / "trace.jsonl"
            config = root / "enginefit.yaml"
            if not config.exists():
                root.mkdir(parents=True, exist_ok=True)
                generate(size, trace, limits, args.span_days)
                configuration(root, trace)
                wall, cpu, peak = enginefit(REPO, root, config, "ingest", limits)
                print(f"{size:,}: ingested in {wall:.1f} s ({cpu:.1f} s CPU), {peak / GIB:.2f} GiB")
            load = os.getloadavg()
            scale = args.budget_scale
            wall, cpu, peak = enginefit(args.code, root, config, "prefix", limits, scale)
            outputs = root / f"prefix-{args.label}"
            shutil.rmtree(outputs, ignore_errors=True)
            shutil.copytree(root / "data" / "generated" / "prefix", outputs)
            print(
                f"{size:,} requests, prefix ({args.label}): {wall:.1f} s wall, {cpu:.1f} s CPU, "
                f"peak {peak / GIB:.3f} GiB summed PSS; load {load[0]:.1f} before, "
                f"{os.getloadavg()[0]:.1f} after; outputs in {outputs}",
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv[1:])
