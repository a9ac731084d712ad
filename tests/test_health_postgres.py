"""The health history on a real PostgreSQL server the tests start themselves (``initdb`` and
``pg_ctl`` as a non-root user, a free port; see ``tools/testing/postgres.py``): the driver's extra,
Alembic's migrations, several clusters writing at once, a writer dying midway, the history and
the dashboard's Health page reading it, a newer schema refused, and the 4-host namespace check
writing to it. Skipped, saying so, only where PostgreSQL's binaries are absent."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa

from dpro.anomaly.health.history import History
from dpro.anomaly.health.model import Check, HealthReport, Metric, Node
from tools.testing.postgres import PostgresServer, missing_postgres

from .conftest import ROOT, assert_one_line_error, dpro

pytestmark = pytest.mark.skipif(missing_postgres() is not None, reason=str(missing_postgres()))


@pytest.fixture(scope="module")
def server():
    with PostgresServer() as running:
        yield running


def night(day: int, send_gbps: float = 9.5) -> HealthReport:
    """One night's report of two hosts."""
    nodes = [Node(host, [Check("pairwise", metrics=[Metric("send_gbps", send_gbps, "Gb/s", True)])])
             for host in ("node0", "node1")]
    return HealthReport(f"2026-11-{day:02d}T02:00:00", f"2026-11-{day:02d}T02:05:00", nodes,
                        facts={"world_size": 2, "backend": "gloo"})


def psycopg_hidden(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python finds no psycopg (as where the extra is not installed)."""
    fake = tmp_path / "hide" / "psycopg"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'psycopg'\", name='psycopg')\n")
    import os

    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), str(ROOT)])}


def test_without_the_driver_a_one_line_error_names_the_extra(server: PostgresServer, tmp_path: Path) -> None:
    done = dpro("health", "history", "--db", server.url(), env=psycopg_hidden(tmp_path))
    assert_one_line_error(done, "psycopg 3", "pip install 'dpro-profiler[postgres]'")


def test_migrations_from_empty_and_from_the_previous_revision(server: PostgresServer) -> None:
    from alembic import command

    from dpro.anomaly.health.history import _alembic_config

    with History.open(server.url("fresh")) as history:
        assert history.runs() == []
    assert server.psql("SELECT version_num FROM alembic_version", "fresh").strip() == "0002"

    url = server.url("older")  # a history made by the dpro before clusters: revision 0001, one run in it
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    config = _alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0001")
        connection.execute(sa.text("INSERT INTO health_runs (started, finished, verdict, facts, suspects) "
                                   "VALUES ('2026-11-01 02:00', '2026-11-01 02:05', 'healthy', '{}', '[]')"))
    engine.dispose()
    with History.open(url) as history:
        [run] = history.runs()
        assert run["cluster"] == "" and run["verdict"] == "healthy"
    assert server.psql("SELECT version_num FROM alembic_version", "older").strip() == "0002"


WRITER = textwrap.dedent("""
    import sys
    from dpro.anomaly.health.history import History
    from tests.test_health_postgres import night

    url, cluster = sys.argv[1], sys.argv[2]
    with History.open(url, cluster=cluster) as history:
        for day in range(1, 11):
            first = history.add(night(day))
            assert history.add(night(day)) == first  # a writer that retries stores the night once
""")


def test_two_clusters_writing_the_same_nights_at_once_lose_nothing_and_duplicate_nothing(server: PostgresServer) -> None:
    url = server.url("shared")
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, url, cluster], cwd=ROOT, stderr=subprocess.PIPE,
                                text=True) for cluster in ("east", "west", "east")]  # east twice: two writers, one run
    for writer in writers:
        assert writer.wait(timeout=120) == 0, writer.stderr.read()
    counts = server.psql("SELECT cluster, count(*) FROM health_runs GROUP BY cluster ORDER BY cluster", "shared")
    assert counts.split() == ["east|10", "west|10"]
    with History.open(url, cluster="west") as west:
        assert len(west.runs()) == 10 and {r["cluster"] for r in west.runs()} == {"west"}
        assert len(west.values("node0", "pairwise/send_gbps")) == 10  # a cluster's baseline: its own nights


def test_a_writer_that_dies_midway_leaves_nothing(server: PostgresServer) -> None:
    url = server.url("crash")
    dying = textwrap.dedent("""
        import os, sys
        from dpro.anomaly.health.history import History, NodeRow, RunRow
        from datetime import datetime

        with History.open(sys.argv[1]) as history, history._session() as session:
            run = RunRow(cluster="", started=datetime(2026, 11, 3, 2), finished=datetime(2026, 11, 3, 2, 5),
                         verdict="healthy", facts="{}", suspects="[]")
            run.nodes.append(NodeRow(host="node0", verdict="healthy"))
            session.add(run)
            session.flush()  # the rows are on the server, the night's transaction not committed
            os._exit(9)  # the writer dies (a node lost at night)
    """)
    assert subprocess.run([sys.executable, "-c", dying, url], cwd=ROOT, timeout=120).returncode == 9
    assert server.psql("SELECT count(*) FROM health_runs", "crash").strip() == "0"
    assert server.psql("SELECT count(*) FROM health_nodes", "crash").strip() == "0"


def test_the_history_command_and_the_health_page_read_it(server: PostgresServer) -> None:
    from dpro.dashboard.health_history import HealthView

    url = server.url("read")
    with History.open(url, cluster="east") as history:
        for day in range(1, 6):
            history.add(night(day, 9.5 if day < 5 else 4.0))  # the last night's sends halved
    shown = dpro("health", "history", "--db", url, "--cluster", "east", "--json")
    assert shown.returncode == 1, shown.stderr  # the last night regressed
    found = json.loads(shown.stdout)
    assert len(found["runs"]) == 5 and found["regressions"]
    view = HealthView.read(url)
    assert len(view.runs) == 5 and view.runs[0]["cluster"] == "east"


def test_a_database_of_a_newer_dpro_is_refused_in_one_line(server: PostgresServer) -> None:
    url = server.url("newer")
    with History.open(url):
        pass
    server.psql("UPDATE alembic_version SET version_num = '0099'", "newer")
    for command in (("health", "history", "--db", url), ("dashboard", "--health-db", url)):
        assert_one_line_error(dpro(*command), "schema revision 0099", "newer than this dpro")


@pytest.mark.privileged
@pytest.mark.slow
def test_the_four_host_namespace_check_writes_its_night_to_postgres(tmp_path: Path) -> None:
    """``torchrun --no-python ... dpro health`` on 4 namespace hosts, the server in host 0's
    namespace (where every host reaches it); then ``dpro health history`` reads the night."""
    from tools.testing.netns import NetnsCluster, can_build_namespaces, torchrun_across_hosts

    reason = can_build_namespaces()
    if reason:
        pytest.skip(reason)
    config = tmp_path / "quick.yaml"
    config.write_text("collectives: {ops: [all_reduce], sizes_mb: [1], iterations: 2}\npairwise: {seconds: 0.08}\n")
    program = Path(sys.executable).parent / "dpro"
    with NetnsCluster(4, prefix="dq", subnet="10.78.0") as cluster:
        host = cluster.hosts[0]
        with PostgresServer(netns=host.netns, address=host.ip) as server:
            url = server.url("health")
            runs = torchrun_across_hosts(cluster, [program, "health", "--db", url, "--cluster", "lab", "--config", config,
                                                   "-o", tmp_path / "night"], no_python=True, timeout=300)
            assert all(r.returncode in (0, 1) for r in runs), [r.stderr[-2000:] for r in runs]
            shown = cluster.run(3, [program, "health", "history", "--db", url, "--cluster", "lab", "--json"],
                                timeout=120, capture_output=True, text=True)
            assert shown.stdout.strip(), shown.stderr
            found = json.loads(shown.stdout)
            assert len(found["runs"]) == 1 and {"dq-h0", "dq-h1", "dq-h2", "dq-h3"} <= set(found["nodes"]), shown.stderr
            assert server.psql("SELECT cluster, verdict FROM health_runs", "health").split("|")[0] == "lab"
