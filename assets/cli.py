"""The ``enginefit`` console script: the pipeline's ad-hoc commands plus ``report`` and ``decide``.

``report`` runs the whole Dagster asset graph on a configuration as one run on the instance
(``--executor auto``, the default: in process, or independent steps side by side in processes
of their own for a quarter far past the flattening limit, :func:`assets.executors.auto_executor`)
and prints where every output went. ``decide`` has Dagster materialise what the decision needs that
is missing or stale (:func:`assets.definitions.materialise_stale`), then decides. They live here,
not in ``pipeline/``, because they drive Dagster.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shlex
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.cli import build_parser, run_parsed
from pipeline.commands.common import DEFAULT_CONFIG, add_config_argument, command_config
from pipeline.errors import EnginefitError
from pipeline.ledger import chain_head

if TYPE_CHECKING:
    import dagster as dg

    from pipeline.config import Config


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of steps, 1 or more")
    return value


DECIDE_DOC = """    enginefit decide [--config FILE] [--previous RECORD] [--as-of YYYY-MM-DD] [--json]

decide has Dagster materialise, for the configured workload, every asset the decision depends
on that is missing or stale (an input file or configuration section changed since it ran), then
decides and writes the record under decision/ exactly as the engine_decision asset does.
--previous evaluates an earlier quarter's revisit triggers against this run's measurements.
"""


def add_decide_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``decide``'s arguments (here beside the command, which drives Dagster, so that parsing
    loads no stage)."""
    decide: argparse.ArgumentParser = subparsers.add_parser(
        "decide",
        help="recommend an engine with its rationale, costs and revisit triggers",
        description=DECIDE_DOC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_argument(decide)
    decide.add_argument(
        "--previous",
        type=Path,
        metavar="RECORD",
        help="a previous decision.json whose triggers to check",
    )
    decide.add_argument(
        "--as-of",
        metavar="YYYY-MM-DD",
        help="the decision's date, today or earlier (default: bench.as_of, else "
        "ENGINEFIT_RUN_DATE, else today)",
    )
    decide.add_argument("--json", action="store_true", help="print the record as JSON")
    return decide


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report",
        help="run the whole asset graph (ingest → … → report) on a configuration",
        description="Materialise every asset and check as one Dagster run on the instance in "
        "$DAGSTER_HOME (default: .dagster_home beside the configuration, embedded SQLite; "
        "docs/dagster.postgres.yaml for PostgreSQL), then print the outputs.",
    )
    add_config_argument(parser)
    parser.add_argument(
        "--executor",
        choices=["auto", "in_process", "multiprocess"],
        default="auto",
        help="in_process (the faster on a few cores): one step at a time in this process; "
        "multiprocess: independent steps (file reads, scenarios, checks) side by side, one "
        "process per step (the path a cluster executor takes); auto (default): multiprocess "
        "past 4 × simulation.curve_exact_max_blocks stored blocks, else in_process",
    )
    parser.add_argument(
        "--max-concurrent",
        type=_at_least_one,
        default=None,
        metavar="N",
        help="multiprocess: at most N steps at once (default: one per CPU)",
    )
    parser.set_defaults(func=run_report)
    add_decide_parser(subparsers).set_defaults(func=run_decide)


# Written into a new (or empty) dagster.yaml. The run history stays Dagster's embedded SQLite in
# that folder; PostgreSQL is a dagster.yaml like docs/dagster.postgres.yaml.
DEFAULT_DAGSTER_YAML = """\
# Dagster instance settings for enginefit (written by `enginefit report` into an empty file;
# edit freely). Run and event storage: embedded SQLite in this folder, Dagster's default. For
# PostgreSQL, see docs/dagster.postgres.yaml.
python_logs:
  # Each step's process announces itself at DEBUG on the console; `enginefit report` prints
  # one line per finished step instead (the run history keeps every event).
  python_log_level: INFO
# enginefit is an offline tool over production traces: nothing leaves the machine unless you
# turn this on.
telemetry:
  enabled: false
"""


def _ensure_dagster_home(project: Path) -> Path:
    """``$DAGSTER_HOME``, else ``.dagster_home`` beside the configuration file (the project),
    never the current folder."""
    home = Path(os.environ.get("DAGSTER_HOME") or project / ".dagster_home").resolve()
    if home.exists() and not home.is_dir():
        raise EnginefitError(
            f"DAGSTER_HOME={home}: not a folder; set DAGSTER_HOME to the folder for Dagster's "
            "run history (or unset it to use .dagster_home beside the configuration)"
        )
    home.mkdir(parents=True, exist_ok=True)
    settings = home / "dagster.yaml"
    if not settings.exists() or settings.stat().st_size == 0:
        settings.write_text(DEFAULT_DAGSTER_YAML, encoding="utf-8")
    os.environ["DAGSTER_HOME"] = str(home)
    return home


# The checkout this code runs from: its Makefile's `make ui` opens <checkout>/.dagster_home.
CHECKOUT = Path(__file__).resolve().parent.parent


def ui_command(home: Path, project: Path) -> str:
    """The command that opens the Dagster UI on the run history in ``home`` with the
    definitions of ``project``'s enginefit.yaml: `make ui` only where that is what it opens
    (the checkout's own .dagster_home and configuration), else dg with DAGSTER_HOME set."""
    if home == (CHECKOUT / ".dagster_home").resolve() and project.resolve() == CHECKOUT:
        return (
            "make ui"
            if Path.cwd().resolve() == CHECKOUT
            else f"make -C {shlex.quote(str(CHECKOUT))} ui"
        )
    dg = Path(sys.executable).parent / "dg"
    return (
        f"DAGSTER_HOME={shlex.quote(str(home))} {shlex.quote(str(dg)) if dg.exists() else 'dg'} "
        f"dev -m assets.definitions -d {shlex.quote(str(project))}"
    )


# What SQLite says when the disk under DAGSTER_HOME is full (or a file-size limit is reached).
_DISK_FULL = ("disk I/O error", "database or disk is full")


@contextmanager
def _run_storage(home: Path) -> Iterator[None]:
    """Dagster's run storage failing as one line naming ``DAGSTER_HOME``, not a SQLAlchemy
    traceback: a full disk (SQLite's "disk I/O error") says to free space; another run holding
    the history, or anything else, says so and never blames the disk."""
    import sqlalchemy.exc  # import here: Dagster loads it; only report and decide use it

    try:
        yield
    except sqlalchemy.exc.DBAPIError as exc:
        said = str(exc.orig)
        if any(words in said for words in _DISK_FULL):
            advice = "free some space there, or set DAGSTER_HOME to a folder with room"
        elif isinstance(exc, sqlalchemy.exc.IntegrityError) or "locked" in said:
            advice = (
                "another enginefit run was using the same run history at that moment; run "
                "again once it has finished, or give each run its own DAGSTER_HOME"
            )
        else:
            advice = "check that folder, or set DAGSTER_HOME to another one"
        raise EnginefitError(
            f"DAGSTER_HOME={home}: Dagster could not write its run history ({said}); {advice}"
        ) from exc


@contextmanager
def _instance(home: Path) -> Iterator[dg.DagsterInstance]:
    """The Dagster instance in ``home``. Its storage is created under a lock on the folder:
    two first runs started together on a fresh folder would otherwise both create the SQLite
    tables and mark their indexes built, and one would fail on a UNIQUE constraint."""
    import dagster as dg  # import here: Dagster takes seconds to load

    with _run_storage(home):
        with (home / ".enginefit-storage.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            instance = dg.DagsterInstance.get()
            try:
                # Each storage builds its tables when first touched: now, under the lock.
                _ = (instance.run_storage, instance.event_log_storage, instance.schedule_storage)
            except BaseException:
                instance.dispose()
                raise
        # import here: it loads Dagster
        from assets.progress import storage_echoes_dropped

        with instance, storage_echoes_dropped():
            yield instance


def run_report(args: argparse.Namespace) -> int:
    # Validate before starting Dagster, so a bad file is one line, not a failed run per asset.
    args.config = str(Path(args.config or DEFAULT_CONFIG).resolve())
    config = command_config(args)
    _benchmark_files_readable(config)
    config_path = Path(args.config)
    home = _ensure_dagster_home(config_path.parent)
    # The seconds before the first step ends (Dagster loading, the run starting) are not silent.
    print(f"enginefit report: starting the run on the Dagster instance in {home}", file=sys.stderr)
    from assets.definitions import run_full_graph  # import here: it loads Dagster
    from assets.executors import auto_executor  # import here: it loads Dagster
    from assets.progress import command_progress  # import here: it loads Dagster

    if args.executor == "auto":
        choice = auto_executor(config)
        executor, why = choice.executor, f"auto: {choice.reason}; --executor sets it"
    else:
        executor, why = args.executor, "--executor"
    print(f"enginefit report: executor {executor} ({why})", file=sys.stderr)

    with _instance(home) as instance:
        run = run_full_graph(
            config_path,
            instance,
            executor=executor,
            max_concurrent=args.max_concurrent,
            progress=command_progress("report"),
        )
    workload_dir = config.layout().root
    print(f"outputs under {workload_dir}:")
    for asset_key, _, path in sorted(run.outputs, key=lambda output: output[2]):
        shown = (
            Path(path).relative_to(workload_dir)
            if Path(path).is_relative_to(workload_dir)
            else path
        )
        print(f"  {shown}  ({asset_key})")
    if run.resumed:
        print("replays of the quarter's days (docs/resume.md):")
        for line in run.resumed:
            print(f"  {line}")
    print("summary:")
    # import here: a command line loads only its own area (tests/test_cli_areas.py)
    from pipeline.report.headline import headline_table, headlines

    print(headline_table(headlines(config.layout(), config.filing())))
    print(f"checks: {run.checks_passed} passed, {len(run.checks_failed)} did not")
    for check, severity, problems in run.checks_failed:
        print(f"  {severity} {check}: {problems}")
    print(
        f"Dagster run history: {home} (open the UI with `{ui_command(home, config_path.parent)}`)"
    )
    for step, message in run.failures:
        what = "the run" if step == "run" else f"step {step}"
        print(f"enginefit: error: {what} failed: {message}", file=sys.stderr)
    pdf = next((path for _, label, path in run.outputs if label == "pdf_path"), None)
    if pdf is not None:
        if run.unchanged_report:
            print(
                "report: nothing changed since this version (inputs, configuration, catalog and "
                "code match it): no new version published"
            )
        print(
            f"ledger chain head: {chain_head(config.filing().tree.read_ledger())} (keep a copy "
            "elsewhere: `enginefit audit --chain-head SHA256` then catches a rewritten ledger)"
        )
        print(f"PDF: {pdf}")
    return 0 if run.success else 2


def _benchmark_files_readable(config: Config) -> None:
    """The configured benchmark files and their manifests read before the graph starts: a bad
    one (an impossible run date, a missing folder) is one line at once, not an error after
    the ingest, shape and simulation steps have run (the bench step reads them again)."""
    from pipeline.bench.stage import read_results  # import here: only these commands need it

    read_results(config.bench)


def run_decide(args: argparse.Namespace) -> int:
    args.config = str(Path(args.config or DEFAULT_CONFIG).resolve())
    # import here: a command line loads only its own area (tests/test_cli_areas.py)
    from pipeline.commands.decision import decide, decide_config

    config = decide_config(args, command_config(args))
    _benchmark_files_readable(config)
    config_path = Path(args.config)
    home = _ensure_dagster_home(config_path.parent)
    from assets.definitions import materialise_stale  # import here: it loads Dagster
    from assets.progress import command_progress  # import here: it loads Dagster

    with _instance(home) as instance:
        ran = materialise_stale(
            config_path, instance, "engine_decision", progress=command_progress("decide")
        )
    if ran:
        print(
            f"enginefit decide: materialised what was missing or stale: {', '.join(ran)}",
            file=sys.stderr,
        )
    return decide(args, config)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(extra=[register], argv=argv)
    return run_parsed(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
