"""Run and event storage on a real PostgreSQL server, configured by the documented
docs/dagster.postgres.yaml alone: `enginefit report` runs the whole graph (multiprocess executor)
against a throwaway server on loopback, and the run and its events are in the database.

Skipped with the reason unless PostgreSQL's server binaries (Debian: `apt-get install
postgresql`) and the `postgres` extra (dagster-postgres) are installed; `make test-postgres`
sets ENGINEFIT_REQUIRE_POSTGRES=1, which turns that skip into a failure.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
import yaml

from assets.cli import main
from tests.conftest import REPO, bundled_config

DOCUMENTED_YAML = REPO / "docs" / "dagster.postgres.yaml"


def _server_binaries() -> Path | None:
    """The folder of initdb and pg_ctl: on PATH, else Debian's /usr/lib/postgresql/<v>/bin."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    return Path(candidates[0]).parent if candidates else None


def _missing() -> str | None:
    try:
        import dagster_postgres  # noqa: F401
    except ImportError:
        return "dagster-postgres is not installed (pip install -e '.[postgres]')"
    if _server_binaries() is None:
        return "PostgreSQL server binaries (initdb, pg_ctl) not found (Debian: apt-get install postgresql)"
    return None


_MISSING = _missing()
if _MISSING and os.environ.get("ENGINEFIT_REQUIRE_POSTGRES") == "1":
    raise RuntimeError(f"ENGINEFIT_REQUIRE_POSTGRES=1 but {_MISSING}")
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Server:
    port: int
    user: str
    password: str
    database: str

    def env(self) -> dict[str, str]:
        """What docs/dagster.postgres.yaml reads."""
        return {
            "DAGSTER_PG_HOST": "127.0.0.1",
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_DB": self.database,
            "DAGSTER_PG_USERNAME": self.user,
            "DAGSTER_PG_PASSWORD": self.password,
        }


@pytest.fixture(scope="module")
def postgres() -> Iterator[Server]:
    """A PostgreSQL server of its own: initdb into a temporary folder, listening on 127.0.0.1
    only, on a free port, password required; stopped and deleted afterwards. initdb refuses to
    run as root, so as root the server runs as the `postgres` (else `nobody`) account."""
    binaries = _server_binaries()
    assert binaries is not None
    run_as: list[str] = []
    owner = None
    if os.geteuid() == 0:
        account = next((name for name in ("postgres", "nobody") if _account_exists(name)), "nobody")
        owner = pwd.getpwnam(account)
        run_as = ["runuser", "-u", account, "--"]
    folder = Path(tempfile.mkdtemp(prefix="enginefit-pg-"))
    data = folder / "data"
    password = secrets.token_hex(12)
    pwfile = folder / "pwfile"
    pwfile.write_text(password + "\n")
    if owner is not None:
        for path in (folder, pwfile):
            os.chown(path, owner.pw_uid, owner.pw_gid)
    port = _free_port()
    server = Server(port=port, user="enginefit", password=password, database="dagster")

    def pg(*command: str) -> None:
        subprocess.run([*run_as, *command], check=True, capture_output=True, timeout=120)

    try:
        pg(
            str(binaries / "initdb"),
            "-D",
            str(data),
            "-U",
            server.user,
            f"--pwfile={pwfile}",
            "--auth-local=scram-sha-256",
            "--auth-host=scram-sha-256",
            "--encoding=UTF8",
            "--no-sync",  # a throwaway server: waiting for the disk is 2 of its 3 s
        )
        options = f"-h 127.0.0.1 -p {port} -k {folder} -c fsync=off"
        log = str(folder / "log")
        pg(str(binaries / "pg_ctl"), "-D", str(data), "-o", options, "-l", log, "-w", "start")
        _create_database(server)
        yield server
    finally:
        subprocess.run(
            [*run_as, str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(folder, ignore_errors=True)


def _account_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _connect(server: Server, database: str) -> object:
    import psycopg2

    return psycopg2.connect(
        host="127.0.0.1",
        port=server.port,
        user=server.user,
        password=server.password,
        dbname=database,
        connect_timeout=10,
    )


def _create_database(server: Server) -> None:
    """Wait for the server to accept connections, then create Dagster's database."""
    import time

    import psycopg2

    deadline = time.monotonic() + 60
    while True:
        try:
            connection = _connect(server, "postgres")
            break
        except psycopg2.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    connection.autocommit = True  # type: ignore[attr-defined]
    with connection.cursor() as cursor:  # type: ignore[attr-defined]
        cursor.execute(f"CREATE DATABASE {server.database}")
    connection.close()  # type: ignore[attr-defined]


@pytest.mark.usefixtures("pdf_as_its_html")
def test_the_graph_runs_with_its_history_in_postgres(
    postgres: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DAGSTER_HOME holds only the documented dagster.yaml: the run succeeds, and the runs and
    event_logs tables of the database hold it, its materialisations and its check results."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(DOCUMENTED_YAML, home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    for name, value in postgres.env().items():
        monkeypatch.setenv(name, value)

    # The first tenth of the bundled sample: where the history goes does not depend on how
    # much traffic there is, and every step (each in a process of its own) still runs.
    trace = tmp_path / "trace.jsonl"
    lines = (REPO / "traces" / "mooncake" / "conversation_trace.jsonl").read_text().splitlines()
    trace.write_text("\n".join(lines[:1_200]) + "\n")
    config = bundled_config(tmp_path, "pg")
    raw = yaml.safe_load(config.read_text())
    raw["workload"]["traces"] = [{"path": str(trace), "format": "auto"}]
    config.write_text(yaml.safe_dump(raw))

    assert main(["report", "--config", str(config)]) == 0

    with dg.DagsterInstance.get() as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
        (run,) = instance.get_runs()
        assert run.job_name == "full_report" and run.status == dg.DagsterRunStatus.SUCCESS
    connection = _connect(postgres, postgres.database)
    with connection.cursor() as cursor:  # type: ignore[attr-defined]
        cursor.execute("SELECT run_id, status FROM runs")
        assert cursor.fetchall() == [(run.run_id, "SUCCESS")]
        cursor.execute(
            "SELECT dagster_event_type, count(*) FROM event_logs WHERE run_id = %s "
            "GROUP BY dagster_event_type",
            (run.run_id,),
        )
        counts = dict(cursor.fetchall())
    connection.close()  # type: ignore[attr-defined]
    assert counts["ASSET_MATERIALIZATION"] >= 12
    assert (
        counts["ASSET_CHECK_EVALUATION"] == 18
    )  # one per asset check of the graph (tests/test_full_graph.py)
    assert "STEP_FAILURE" not in counts
    # No SQLite run history beside the configuration: storage is the database's alone.
    assert not (home / "history").exists()
