"""Shared test helpers: where the real public data lives, and a tiny workload configuration."""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import math
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import polars as pl
import pytest
import yaml
from hypothesis import settings as hypothesis_settings

from pipeline.bench.config import BenchConfig
from pipeline.config import default_config
from pipeline.ingest.stage import split_parts
from pipeline.layout import WorkloadLayout
from pipeline.sim.config import SimConfig
from pipeline.store import publish_ingest

if TYPE_CHECKING:
    from assets.definitions import GraphRun
    from tests.bundled_report import Bundle

# No property test fails for being slow: hypothesis's default deadline (200 ms an example) is a
# wall-clock bound, whose verdict would depend on how busy the machine is.
hypothesis_settings.register_profile("enginefit", deadline=None)
hypothesis_settings.load_profile("enginefit")

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
# Every section at its documented default (pipeline/defaults.yaml); tests derive variants with
# ``DEFAULTS.<section>.replace(key=value)``.
DEFAULTS = default_config()


# Licensed traces the project bundles byte-for-byte (see traces/NOTICE); tests of these files run
# on the bundled copy when ../shared is absent, so a fresh clone still exercises them.
BUNDLED_COPIES = {
    ("traces", "mooncake-fast25", "conversation_trace.jsonl"): (
        REPO / "traces" / "mooncake" / "conversation_trace.jsonl"
    ),
    ("traces", "azure-llm-2023", "AzureLLMInferenceTrace_code.csv"): (
        REPO / "traces" / "azure-code" / "AzureLLMInferenceTrace_code.csv"
    ),
    ("traces", "tracelab-examples", "sanitized", "round_trace.jsonl"): (
        REPO / "traces" / "tracelab" / "round_trace.jsonl"
    ),
}


def trace_or_missing(*parts: str) -> Path:
    """The ../shared file, else its bundled copy, else the (missing) ../shared path."""
    path = SHARED.joinpath(*parts)
    if path.exists():
        return path
    return BUNDLED_COPIES.get(parts, path)


def shared_path(*parts: str, bundled_ok: bool = True) -> Path:
    """A file under ../shared (or its bundled copy), or skip when neither exists (a fresh clone)."""
    path = trace_or_missing(*parts) if bundled_ok else SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(
            f"{path} not available (../shared is only present in the development workspace)"
        )
    return path


def write_config(tmp_path: Path, traces: list[str], **workload: object) -> Path:
    """A minimal enginefit.yaml in ``tmp_path`` naming ``traces``; data goes under tmp_path."""
    settings = {"name": "t", "block_size": 16, "hash_salt": "test-salt", **workload}
    lines = ["workload:", "  traces:"]
    lines += [f"    - path: {t}" for t in traces]
    lines += [f"  {key}: {value}" for key, value in settings.items()]
    lines += [
        "paths:",
        f"  data_dir: {tmp_path / 'data'}",
        f"  reports_dir: {tmp_path / 'reports'}",
    ]
    path = tmp_path / "enginefit.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def bundled_config(tmp_path: Path, name: str) -> Path:
    """The bundled enginefit.yaml with absolute input paths, a fixed benchmark date and a data
    folder of its own under ``tmp_path / name``."""
    raw = yaml.safe_load((REPO / "enginefit.yaml").read_text())
    raw["workload"]["traces"] = [
        {**t, "path": str(REPO / t["path"])} for t in raw["workload"]["traces"]
    ]
    raw["bench"]["results"] = [str(REPO / p) for p in raw["bench"]["results"]]
    raw["bench"]["as_of"] = "2026-11-29"
    raw["paths"] = {
        "data_dir": str(tmp_path / name / "data"),
        "reports_dir": str(tmp_path / name / "reports"),
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def shared_if_present(*parts: str) -> list[Path]:
    """``[path]`` when the ../shared file exists, else ``[]`` (for parametrize lists)."""
    path = SHARED.joinpath(*parts)
    return [path] if path.exists() else []


@contextlib.contextmanager
def dagster_history() -> Iterator[Path]:
    """A new folder for a Dagster run history, on the machine's RAM disk where it has one, and
    removed afterwards. Dagster's SQLite syncs the disk at each event it stores, thousands a
    run: on a busy disk most of a command's time. Nothing the product records names it."""
    ram = Path("/dev/shm")
    writable = ram.is_dir() and os.access(ram, os.W_OK)
    folder = Path(tempfile.mkdtemp(prefix="enginefit-dagster-", dir=ram if writable else None))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def _dagster_home() -> Iterator[Path]:
    """The test's run history folder. Set up before ``monkeypatch``, it is removed after the
    test's patches are undone (one of ``os.open`` would stop the removal)."""
    with dagster_history() as home:
        yield home


@pytest.fixture(autouse=True)
def _run_outside_the_repo(
    _dagster_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commands read ./enginefit.yaml when present: tests run in an empty folder so the bundled
    configuration never leaks into them (a test that wants one passes --config)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ENGINEFIT_HASH_SALT", raising=False)
    # `report` and `decide` set DAGSTER_HOME for the rest of the process (assets/cli.py); set
    # here first, it is restored after the test, so one test's instance never serves the next.
    monkeypatch.setenv("DAGSTER_HOME", str(_dagster_home))


@pytest.fixture(autouse=True, scope="session")
def _code_under_test_is_what_was_imported() -> Iterator[None]:
    """A version's identity names the code (commit, uncommitted changes); a commit made while
    the suite runs changes neither the code imported nor what a version published earlier in
    the session (the shared ones above) was made from."""
    from pipeline.report import stage

    imported = stage.code_version()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stage, "code_version", lambda: imported)
        yield


@contextlib.contextmanager
def _as_a_test_runs(folder: Path) -> Iterator[None]:
    """What ``_run_outside_the_repo`` gives each test, for a session fixture's work."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.delenv("ENGINEFIT_HASH_SALT", raising=False)
        patch.delenv("DAGSTER_HOME", raising=False)
        yield


def _shared_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every pytest-xdist worker of this run sees (the run's base temporary folder),
    or this session's own when the suite runs in one process."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def _exclusive(lock: Path) -> Iterator[None]:
    """Held by one process of the run at a time (an advisory lock on ``lock``)."""
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _built_once(shared: Path, name: str, build: Callable[[Path], T]) -> T:
    """``build(folder)``'s result, computed by the first worker that asks and read back by the
    others (pickled beside the folder it built): an expensive fixture costs once per run, not
    once per worker."""
    folder, result = shared / name, shared / f"{name}.pickle"
    with _exclusive(shared / f"{name}.lock"):
        if not result.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a failed build left: the next tries
            folder.mkdir()
            with _as_a_test_runs(folder):
                built = build(folder)
            result.write_bytes(pickle.dumps(built))
        value: T = pickle.loads(result.read_bytes())
        return value


@pytest.fixture(scope="session")
def _bundled_publication(tmp_path_factory: pytest.TempPathFactory) -> tuple[Bundle, Path, Path]:
    """The bundled sample's first version, published once per run (shared by the xdist
    workers, with its PDF's text), a pristine copy of its workspace, and the lock a test holds
    while it uses it."""
    from tests.bundled_report import extracted, publish_bundle, remember

    shared = _shared_folder(tmp_path_factory)

    def publish_and_keep_a_copy(root: Path) -> tuple[Bundle, Path, dict[str, str]]:
        bundle = publish_bundle(root)
        pristine = shared / "bundled-report-pristine"
        shutil.rmtree(pristine, ignore_errors=True)
        shutil.copytree(root, pristine, symlinks=True)
        return bundle, pristine, extracted(bundle.first.pdf)

    bundle, pristine, texts = _built_once(shared, "bundled-report", publish_and_keep_a_copy)
    remember(texts)
    return bundle, pristine, shared / "bundled-report-in-use.lock"


@pytest.fixture
def bundled(_bundled_publication: tuple[Bundle, Path, Path]) -> Iterator[Bundle]:
    """The bundled sample's first published version, restored from the pristine copy where it
    was published (its manifest records absolute paths): the test may change anything in it.
    One test at a time across the workers uses that folder."""
    bundle, pristine, in_use = _bundled_publication
    with _exclusive(in_use):
        shutil.rmtree(bundle.root)
        shutil.copytree(pristine, bundle.root, symlinks=True)
        yield bundle


@pytest.fixture
def pdf_as_its_html(monkeypatch: pytest.MonkeyPatch) -> None:
    """Versions published in this test carry a stand-in for their PDF (the HTML it would be
    rendered from): for tests of the ledger, dates, audit and what a version says, which read
    the published HTML. WeasyPrint is most of a publication's cost, and the PDF itself is
    tested on real renders (tests/test_report.py)."""
    from pipeline.report import present
    from tests.bundled_report import render_the_html_as_the_pdf

    monkeypatch.setattr(present, "render_pdf", render_the_html_as_the_pdf)


@pytest.fixture(scope="session")
def bundled_graph_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[GraphRun, Path]:
    """The whole asset graph run once per run on the bundled configuration, as `make report`
    runs it: `enginefit report` from an empty folder with no ``DAGSTER_HOME`` (shared by the
    xdist workers), and the data folder it wrote: tests compare other paths' outputs with it
    and must not change it. What the command printed is in :func:`bundled_report_output`."""

    def run_the_command(root: Path) -> tuple[GraphRun, Path]:
        import contextlib
        import io

        from assets import definitions
        from assets.cli import main

        runs: list[GraphRun] = []
        graph = definitions.run_full_graph

        def kept(*args: object, **kwargs: object) -> GraphRun:
            runs.append(graph(*args, **kwargs))  # type: ignore[arg-type]
            return runs[-1]

        elsewhere = root / "elsewhere"
        elsewhere.mkdir()
        out, err = io.StringIO(), io.StringIO()
        home = root / ".dagster_home"  # where the command keeps its history: beside the config
        with pytest.MonkeyPatch.context() as patch, dagster_history() as history:
            patch.chdir(elsewhere)
            # Recorded as absent, so the home the command sets for itself is removed after it.
            patch.setenv("DAGSTER_HOME", "")
            patch.delenv("DAGSTER_HOME")
            patch.setattr(definitions, "run_full_graph", kept)
            config = bundled_config(root, "asset")
            # The command writes its history through that name to the RAM disk (dagster_history
            # says why); afterwards the history is copied to that name on the disk.
            home.symlink_to(history, target_is_directory=True)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(["report", "--config", str(config)])
            home.unlink()
            shutil.copytree(history, home)
        (root / "command.out").write_text(f"{code}\n{out.getvalue()}")
        (root / "command.err").write_text(err.getvalue())
        return runs[0], root / "asset" / "data"

    return _built_once(_shared_folder(tmp_path_factory), "bundled-graph", run_the_command)


def bundled_report_output(graph_data: Path) -> tuple[int, str, str]:
    """The exit code, standard output and standard error of :func:`bundled_graph_run`'s
    command, given the data folder it returned."""
    root = graph_data.parents[1]
    code, out = (root / "command.out").read_text().split("\n", 1)
    return int(code), out, (root / "command.err").read_text()


def write_requests(frame: pl.DataFrame, workload_dir: Path) -> None:
    """A canonical request table published alone (no quarantine or summary) as the workload
    folder ``workload_dir``."""
    publish_ingest(WorkloadLayout(workload_dir), split_parts(frame))


def bench_settings(**changes: object) -> BenchConfig:
    """The documented ``bench`` defaults with ``changes`` (already-built values) applied."""
    return DEFAULTS.bench.replace(**changes)


def sim_settings(**changes: object) -> SimConfig:
    """The documented ``simulation`` defaults with ``changes`` applied (validated)."""
    return DEFAULTS.simulation.replace(**changes)


def azure_conversation_trace(path: Path, n: int = 6000) -> Path:
    """An Azure-2023-conversation-like trace (counts only): median prompt ≈ 1,000 tokens, median
    answer ≈ 250, Poisson arrivals at ~3 req/s over about half an hour."""
    rng = np.random.default_rng(7)
    prompt = np.clip(rng.lognormal(math.log(1000), 0.6, n), 20, 16000).astype(int)
    output = np.clip(rng.lognormal(math.log(250), 0.6, n), 5, 2000).astype(int)
    start = dt.datetime(2023, 11, 16, 18, 0, 0)
    times = np.cumsum(rng.exponential(1 / 3.0, n))
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for t, p, o in zip(times, prompt, output, strict=True):
        stamp = (start + dt.timedelta(seconds=float(t))).strftime("%Y-%m-%d %H:%M:%S.%f")
        lines.append(f"{stamp},{p},{o}")
    path.write_text("\n".join(lines) + "\n")
    return path
