"""The ``enginefit`` console script: the pipeline's ad-hoc commands plus ``report``.

``report`` runs the whole Dagster asset graph in-process on a configuration and prints where
every output went. It lives here, not in ``pipeline/``, because it drives Dagster.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.cli import build_parser, run_parsed
from pipeline.cli_common import DEFAULT_CONFIG, add_config_argument, command_config
from pipeline.headline import headline_table, headlines


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report",
        help="run the whole asset graph (ingest → … → report) on a configuration",
        description="Materialise every asset and check in-process with the Dagster instance in "
        "$DAGSTER_HOME (default: ./.dagster_home, embedded SQLite), then print the outputs.",
    )
    add_config_argument(parser)
    parser.set_defaults(func=run_report)


def _ensure_dagster_home(project: Path) -> Path:
    """``$DAGSTER_HOME``, else ``.dagster_home`` beside the configuration file (the project),
    never the current folder."""
    home = Path(os.environ.get("DAGSTER_HOME") or project / ".dagster_home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").touch(exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def run_report(args: argparse.Namespace) -> int:
    # Validate before starting Dagster, so a bad file is one line, not a failed run per asset.
    args.config = str(Path(args.config or DEFAULT_CONFIG).resolve())
    config = command_config(args)
    config_path = Path(args.config)
    home = _ensure_dagster_home(config_path.parent)
    import dagster as dg

    from assets.definitions import run_full_graph

    with dg.DagsterInstance.get() as instance:
        run = run_full_graph(config_path, instance)
    workload_dir = config.layout().root
    print(f"outputs under {workload_dir}:")
    for asset_key, _, path in sorted(run.outputs, key=lambda output: output[2]):
        shown = (
            Path(path).relative_to(workload_dir)
            if Path(path).is_relative_to(workload_dir)
            else path
        )
        print(f"  {shown}  ({asset_key})")
    print("summary:")
    print(headline_table(headlines(config)))
    print(f"checks: {run.checks_passed} passed, {len(run.checks_failed)} did not")
    for check, severity, problems in run.checks_failed:
        print(f"  {severity} {check}: {problems}")
    print(f"Dagster run history: {home} (open the UI with `make ui`)")
    for step, message in run.failures:
        print(f"enginefit: error: step {step} failed: {message}", file=sys.stderr)
    pdf = next((path for _, label, path in run.outputs if label == "pdf_path"), None)
    if pdf is not None:
        if run.unchanged_report:
            print(
                "report: nothing changed since this version (inputs, configuration, catalog and "
                "code match it): no new version published"
            )
        print(f"PDF: {pdf}")
    return 0 if run.success else 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(extra=[register])
    return run_parsed(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
