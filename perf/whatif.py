"""What-if speed: the 40 × 27 decision map (1,080 decisions) after the stages have run.

Run from the repository root: ``.venv/bin/python -m perf.whatif [--requests N] [--repeats K]``.

A ``perf/workload.py`` trace of ``--requests`` requests (default 1,000,000; conversations,
written as an Azure CSV) goes through ``enginefit ingest``, ``shape``, ``prefix``,
``simulate``, ``bench`` (the bundled sweep, ``bench-results/``) and ``capacity`` as child
processes, then the decision is made and written in this process, all untimed. Timed (best of
``--repeats``): reading what the decision reads (``pipeline.whatif.stage.read_inputs``), today's
decision record, and the default map (``whatif.map``: traffic × 0.25 to × 20 by model changes a
quarter 0 to 26), and the bundled scenarios (``enginefit.yaml``'s ``whatif.scenarios``), each a
full decision record with its flips. Target: the map under 10 s. Prints figures; asserts
nothing.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import yaml

from perf import workload
from perf.capacity import REPO, best_of, stage_configuration
from perf.ingest import run_enginefit
from pipeline.commands.decision import configured_inputs as decision_inputs
from pipeline.commands.whatif import configured_inputs
from pipeline.config import load_config
from pipeline.decision import stage as decision_stage
from pipeline.decision.compute import decided
from pipeline.decision.flips import moved
from pipeline.whatif.compute import decision_map, today_context, whatif


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=workload.count, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        trace = root / "trace.csv"
        workload.write_azure_csv(workload.conversations(workload.spec(args.requests)), trace)
        bundled = yaml.safe_load((REPO / "enginefit.yaml").read_text())
        path = stage_configuration(
            root,
            trace,
            "perf-whatif",
            requirements=bundled["requirements"],
            whatif=bundled["whatif"],
        )
        for command in ("ingest", "shape", "prefix", "simulate", "bench", "capacity"):
            run_enginefit([command, "--config", str(path)], root)
        os.environ.setdefault("ENGINEFIT_HASH_SALT", "bench")
        config = load_config(path)
        layout = config.layout()
        inputs = decision_inputs(config)
        record = decision_stage.run(inputs, config.requirements, config.decision)
        decision_stage.write(record, layout)

        read_s, found = best_of(args.repeats, lambda: configured_inputs(config))
        base = today_context(found)
        today_s, today = best_of(args.repeats, lambda: decided(moved(base)))
        section = config.whatif.map
        map_s, drawn = best_of(
            args.repeats, lambda: decision_map(base, today, section.x, section.y)
        )
        scenarios_s, result = best_of(
            args.repeats, lambda: whatif(found, config.whatif, with_map=False)
        )
        print(
            f"what-if on a {args.requests:,}-request workload ({os.cpu_count()} cores): "
            f"read inputs {read_s:.3f} s, today's record {today_s:.3f} s, "
            f"map {len(section.x.values())} × {len(section.y.values())} = {drawn.decisions:,} "
            f"decisions {map_s:.3f} s ({map_s / drawn.decisions * 1e3:.2f} ms each; "
            "target < 10 s), best of "
            f"{args.repeats}; engines on the map: {', '.join(drawn.engines.values())}; "
            f"{len(result.scenarios)} scenarios with full records {scenarios_s:.3f} s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
