"""The health history: every run, node, check and metric in a database (SQLite by default, any
SQLAlchemy URL for a shared one, e.g. ``postgresql://user@db/health``), its schema kept by
Alembic's migrations (``migrations/``), upgraded on open.

    >>> with History.open("sqlite:////tmp/health.db") as history:   # doctest: +SKIP
    ...     history.add(report)
    ...     history.values("node3", "pairwise/send_gbps")
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

from dpro.errors import DproError

from dpro.anomaly.health.model import HealthReport, comparable

__all__ = ["DEFAULT_DB", "History", "HistoryError", "default_url"]

DEFAULT_DB = Path("~/.local/share/dpro/health.db")
MIGRATIONS = Path(__file__).with_name("migrations")
MIGRATION_LOCK = 0x6470726F  # PostgreSQL advisory lock held while a history is migrated ("dpro")


class HistoryError(DproError):
    """A database that cannot be opened, upgraded, read or written."""


class Base(DeclarativeBase):
    pass


class RunRow(Base):
    __tablename__ = "health_runs"
    __table_args__ = (sa.UniqueConstraint("cluster", "started", name="uq_health_runs_cluster_started"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    cluster: Mapped[str] = mapped_column(sa.String(255), index=True, default="", server_default="")
    started: Mapped[datetime] = mapped_column(sa.DateTime, index=True)
    finished: Mapped[datetime] = mapped_column(sa.DateTime)
    verdict: Mapped[str] = mapped_column(sa.String(16))
    facts: Mapped[str] = mapped_column(sa.Text, default="{}")  # JSON: world size, backend, hosts, config
    suspects: Mapped[str] = mapped_column(sa.Text, default="[]")  # JSON, as in health.json
    nodes: Mapped[list[NodeRow]] = relationship(back_populates="run", cascade="all, delete-orphan")


class NodeRow(Base):
    __tablename__ = "health_nodes"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(sa.ForeignKey("health_runs.id", ondelete="CASCADE"), index=True)
    host: Mapped[str] = mapped_column(sa.String(255), index=True)
    verdict: Mapped[str] = mapped_column(sa.String(16))
    run: Mapped[RunRow] = relationship(back_populates="nodes")
    checks: Mapped[list[CheckRow]] = relationship(back_populates="node", cascade="all, delete-orphan")


class CheckRow(Base):
    __tablename__ = "health_checks"
    id: Mapped[int] = mapped_column(primary_key=True)
    node_id: Mapped[int] = mapped_column(sa.ForeignKey("health_nodes.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(sa.String(255))
    status: Mapped[str] = mapped_column(sa.String(8))
    message: Mapped[str] = mapped_column(sa.Text, default="")
    evidence: Mapped[str] = mapped_column(sa.Text, default="{}")  # JSON
    node: Mapped[NodeRow] = relationship(back_populates="checks")
    metrics: Mapped[list[MetricRow]] = relationship(back_populates="check", cascade="all, delete-orphan")


class MetricRow(Base):
    __tablename__ = "health_metrics"
    id: Mapped[int] = mapped_column(primary_key=True)
    check_id: Mapped[int] = mapped_column(sa.ForeignKey("health_checks.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(sa.String(255))
    value: Mapped[float] = mapped_column(sa.Float)
    unit: Mapped[str] = mapped_column(sa.String(32), default="")
    higher_is_better: Mapped[bool | None] = mapped_column(sa.Boolean, nullable=True)
    baseline: Mapped[float | None] = mapped_column(sa.Float, nullable=True)
    check: Mapped[CheckRow] = relationship(back_populates="metrics")


def default_url() -> str:
    """``$DPRO_HEALTH_DB``, else SQLite at ``~/.local/share/dpro/health.db``."""
    return os.environ.get("DPRO_HEALTH_DB") or f"sqlite:///{DEFAULT_DB.expanduser()}"


class History:
    """An open health database (a context manager). ``cluster``: the cluster whose runs this
    history adds and reads (several clusters may share one database); None reads every cluster's
    and adds as the unnamed one, ``""``."""

    def __init__(self, engine: sa.Engine, cluster: str | None = None) -> None:
        self.engine = engine
        self.cluster = cluster

    @classmethod
    def open(cls, url: str | None = None, read_only: bool = False, cluster: str | None = None) -> History:
        """Open (creating an SQLite file and its folder if need be) and bring the schema to the
        newest migration; ``read_only``: neither, the database must exist at the newest migration.
        ``postgresql://`` URLs use psycopg 3 (the ``postgres`` extra)."""
        url = url or default_url()
        try:
            parsed = sa.engine.make_url(url)
        except sa.exc.ArgumentError:
            raise HistoryError(f"not a database URL: {url!r} (e.g. sqlite:///health.db)") from None
        if parsed.drivername == "postgresql":  # SQLAlchemy's default driver for it is psycopg2
            parsed = parsed.set(drivername="postgresql+psycopg")
        shown = parsed.render_as_string(hide_password=True)
        if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
            path = Path(parsed.database).expanduser()
            if read_only and not path.is_file():
                raise HistoryError(f"cannot open the health database {shown}: no such file {path}")
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            engine = sa.create_engine(parsed)
            if read_only:
                _check_schema(engine, shown)
            else:
                _upgrade(engine, shown)
        except ModuleNotFoundError as e:
            if (e.name or "").startswith("psycopg"):
                raise HistoryError(f"cannot open the health database {shown}: its driver, psycopg 3, is not installed "
                                   "(pip install 'dpro-profiler[postgres]')") from None
            raise HistoryError(f"cannot open the health database {shown}: {e}") from None
        except (SQLAlchemyError, ImportError, OSError) as e:
            raise HistoryError(f"cannot open the health database {shown}: {str(e).splitlines()[0]}") from None
        return cls(engine, cluster)

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.engine.dispose()

    def add(self, report: HealthReport) -> int:
        """Store a run in one transaction (a writer that dies midway leaves nothing); its id. A run
        its cluster stored already (same start) is not stored again: its id is returned."""
        cluster = self.cluster or ""
        started = _time(report.started)
        stored = sa.select(RunRow.id).where(RunRow.cluster == cluster, RunRow.started == started)
        run = RunRow(cluster=cluster, started=started, finished=_time(report.finished), verdict=report.verdict,
                     facts=json.dumps(report.facts), suspects=json.dumps(report.to_json()["suspects"]))
        for node in report.nodes:
            row = NodeRow(host=node.host, verdict=node.verdict)
            for c in node.checks:
                row.checks.append(CheckRow(name=c.name, status=c.status, message=c.message,
                                           evidence=json.dumps(c.evidence, default=str),
                                           metrics=[MetricRow(name=m.name, value=m.value, unit=m.unit,
                                                              higher_is_better=m.higher_is_better,
                                                              baseline=m.baseline) for m in c.metrics]))
            run.nodes.append(row)
        with self._session() as session:
            found = session.scalar(stored)
            if found is not None:
                return found
            session.add(run)
            try:
                session.commit()
            except sa.exc.IntegrityError:  # the same run, stored meanwhile by another writer
                session.rollback()
                return session.scalar(stored)
            return run.id

    def values(self, host: str, key: str, before: int | None = None) -> list[float]:
        """Earlier values of ``key`` (``check/metric``) on ``host``, newest first; only runs
        older than run ``before`` when given."""
        check, _, metric = key.rpartition("/")
        query = (sa.select(MetricRow.value).join(CheckRow).join(NodeRow).join(RunRow)
                 .where(NodeRow.host == host, CheckRow.name == check, MetricRow.name == metric)
                 .order_by(RunRow.started.desc(), RunRow.id.desc()))
        if before is not None:
            query = query.where(RunRow.id < before)
        with self._session() as session:
            return [float(v) for v in session.scalars(self._mine(query))]

    def runs(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The runs, newest first: id, started, verdict, facts, suspects, and per node its verdict,
        its metrics ``{check/metric: value}`` and the better direction of those a rule compares
        (``comparable``: ``{check/metric: higher_is_better}``)."""
        query = sa.select(RunRow).order_by(RunRow.started.desc(), RunRow.id.desc()).limit(limit)
        out = []
        with self._session() as session:
            for run in session.scalars(self._mine(query)):
                nodes = {n.host: {"verdict": n.verdict,
                                  "metrics": {f"{c.name}/{m.name}": m.value for c in n.checks for m in c.metrics},
                                  "comparable": {f"{c.name}/{m.name}": m.higher_is_better for c in n.checks
                                                 for m in c.metrics if comparable(m.higher_is_better, m.unit)}}
                         for n in run.nodes}
                out.append({"id": run.id, "cluster": run.cluster,
                            "started": run.started.isoformat(timespec="seconds"), "verdict": run.verdict,
                            "facts": json.loads(run.facts), "suspects": json.loads(run.suspects), "nodes": nodes})
        return out

    def last_verdict(self, host: str) -> tuple[str, str] | None:
        """``(verdict, started)`` of ``host`` in the newest run it took part in, if any."""
        query = (sa.select(NodeRow.verdict, RunRow.started).join(RunRow).where(NodeRow.host == host)
                 .order_by(RunRow.started.desc(), RunRow.id.desc()).limit(1))
        with self._session() as session:
            row = session.execute(self._mine(query)).first()
        return None if row is None else (row[0], row[1].isoformat(timespec="seconds"))

    def _session(self) -> Session:
        return Session(self.engine)

    def _mine(self, query: Any) -> Any:
        """``query`` kept to this history's cluster (every cluster's when it has none)."""
        return query if self.cluster is None else query.where(RunRow.cluster == self.cluster)


def _upgrade(engine: sa.Engine, shown: str) -> None:
    """``alembic upgrade head`` on this engine (a database a newer dpro made is refused)."""
    from alembic import command

    config = _alembic_config()
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":  # writers of several clusters opening one new history at once
            connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        _known_revision(connection, shown)
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


def _known_revision(connection: sa.Connection, shown: str) -> str | None:
    """The database's schema revision; a :class:`HistoryError` when this dpro does not know it."""
    from alembic.migration import MigrationContext
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(_alembic_config())
    current = MigrationContext.configure(connection).get_current_revision()
    if current is not None and current not in {s.revision for s in script.walk_revisions()}:
        raise HistoryError(f"the health database {shown} is at schema revision {current}, newer than this dpro "
                           f"knows (up to {script.get_current_head()}): upgrade dpro to read or write it")
    return current


def _check_schema(engine: sa.Engine, shown: str) -> None:
    """A :class:`HistoryError` unless the database is at the newest migration."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    with engine.connect() as connection:
        current = _known_revision(connection, shown)
    if current is None:
        raise HistoryError(f"{shown} is not a health history (no schema revision)")
    if current != head:
        raise HistoryError(f"the health database {shown} is at schema revision {current}, this dpro reads {head} "
                           "('dpro health history --db URL' upgrades an older one)")


def _alembic_config() -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def _time(iso: str) -> datetime:
    return datetime.fromisoformat(iso).replace(tzinfo=None)
