"""The parts of wake-ups on their own: which tables wake which workers, the probe that
idle polls run, the local channel's sockets, and the pooler check of the listener."""

from __future__ import annotations

import gc
import os
import select as io_select
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import ForeignKey, Integer, create_engine, event, insert, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from dbworker import Coordinator, ExecutionStatus
from dbworker.dialects import for_url
from dbworker.scheduling.discovery import SWEEP_HORIZON_SECONDS, DiscoverySchedule
from dbworker.wakeups.local import QUIET_SECONDS, RUNTIME_DIR_ENV, Receiver, Sender
from dbworker.wakeups.postgresql import Listener, PoolerDetected
from dbworker.wakeups.targets import by_table, dependents


class Base(DeclarativeBase):
    pass


class Album(Base):
    __tablename__ = "wk_album"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    enabled: Mapped[bool]


class Photo(Base):
    __tablename__ = "wk_photo"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    album_id: Mapped[int] = mapped_column(ForeignKey("wk_album.id"))


def handle(source: Any, session: Any) -> Any:
    raise AssertionError("not run here")


def coordinator_with_dependents(url: str) -> Coordinator:
    coordinator = Coordinator(sessionmaker(create_engine(url)), database_url=url)
    coordinator.transactional_worker(
        name="wk_thumb",
        source=Photo,
        eligible=lambda: select(Photo).join(Album).where(Album.enabled.is_(True)),
    )(handle)
    done = coordinator.has_execution_status(
        worker="wk_thumb", source_id=Photo.id, statuses=(ExecutionStatus.FINISHED,)
    )
    coordinator.transactional_worker(
        name="wk_index", source=Photo, eligible=lambda: select(Photo).where(done)
    )(handle)
    return coordinator


def test_every_table_of_eligible_wakes_and_dependents_are_found(tmp_path: Path) -> None:
    coordinator = coordinator_with_dependents(f"sqlite:///{tmp_path / 'db.sqlite'}")
    watched = coordinator._watched()
    tables = by_table(watched)
    album, photo = Base.metadata.tables["wk_album"], Base.metadata.tables["wk_photo"]
    # Enabling an album can make photos eligible: its writes wake wk_thumb too.
    assert tables[album] == {"dbworker_wk_thumb"}
    assert tables[photo] == {"dbworker_wk_thumb", "dbworker_wk_index"}
    assert dependents(watched) == {"wk_thumb": {"wk_index"}}


def test_the_probe_sees_new_rows_and_open_records_only(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    engine = create_engine(url)
    Base.metadata.create_all(engine)
    coordinator = coordinator_with_dependents(url)
    coordinator.create_worker_tables()
    dialect = for_url(url)
    table = coordinator._registration("wk_thumb").table
    with engine.begin() as conn:
        conn.execute(insert(Album), [{"id": 1, "enabled": True}])
        conn.execute(insert(Photo), [{"id": 5, "album_id": 1}])
    with engine.begin() as conn:
        assert dialect.probe(conn, table, 4)  # a row above the watermark
        assert not dialect.probe(conn, table, 5)  # nothing above, no records
        dialect.discover(conn, table)
        assert dialect.probe(conn, table, 5)  # an open (pending) record
        conn.execute(table.table.update().values(status="finished"))
        assert not dialect.probe(conn, table, 5)  # history only


def test_idle_polls_probe_only_once_the_watermark_stood_still() -> None:
    schedule = DiscoverySchedule(next_full_sweep=10_000.0)
    schedule.watermarks.append((100.0, 42))
    assert schedule.probe_above(100.0 + SWEEP_HORIZON_SECONDS + 1) is None  # not idle
    schedule.idle = True
    assert schedule.probe_above(100.0 + SWEEP_HORIZON_SECONDS / 2) is None  # recent keys
    assert schedule.probe_above(100.0 + SWEEP_HORIZON_SECONDS) == 42
    assert schedule.probe_above(10_000.0) is None  # a full sweep is due


def _received(receiver: Receiver, got: list[Any], timeout: float) -> bool:
    """Whether a wake-up came within ``timeout``, received as the scheduler's loop
    does: waiting on the socket, then ``receive()``."""
    deadline = time.monotonic() + timeout
    fd = receiver.fileno()
    assert fd is not None
    while not got and time.monotonic() < deadline:
        io_select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        receiver.receive()
    return bool(got)


def test_the_local_channel_wakes_by_name_and_removes_dead_sockets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Short: a socket's path has at most 107 bytes, and tmp_path can be long.
    runtime = Path(tempfile.mkdtemp(prefix="dbw"))
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(runtime / "run"))
    got: list[set[str] | None] = []

    def wake(names: set[str] | None) -> None:
        got.append(names)

    receiver = Receiver("sqlite:/x.db", wake)
    assert receiver.start()
    try:
        dead = receiver.directory / "1-dead.sock"
        dead.write_bytes(b"")  # a socket file nobody is bound to, as a crash leaves it
        sender = Sender("sqlite:/x.db")
        assert sender.send({"b", "a"}) == 1
        assert _received(receiver, got, 10)
        assert got == [{"a", "b"}]
        assert not dead.exists()
        # Another database's writers do not reach this one.
        assert Sender("sqlite:/y.db").send({"a"}) == 0
    finally:
        receiver.stop()
    assert receiver.path is not None and not receiver.path.exists()
    shutil.rmtree(runtime)


def test_a_sender_lists_the_sockets_again_only_when_the_directory_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runtime = Path(tempfile.mkdtemp(prefix="dbw"))
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(runtime / "run"))
    listings: list[str] = []
    scandir = os.scandir

    def counted(path: Any) -> Any:
        listings.append(str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", counted)
    got: list[set[str] | None] = []
    first = Receiver("sqlite:/x.db", got.append)
    second = Receiver("sqlite:/x.db", got.append)
    assert first.start()
    try:
        sender = Sender("sqlite:/x.db")
        # A directory changed a moment ago is listed at every send: a socket bound in
        # the same tick of the file system's clock would not change its time. (Its
        # time is set ahead, so that a slow test run cannot make it quiet meanwhile.)
        ahead = time.time() + 60
        os.utime(first.directory, (ahead, ahead))
        assert sender.send({"a"}) == 1
        assert sender.send({"a"}) == 1
        assert len(listings) == 2
        aged = time.time() - 2 * QUIET_SECONDS
        os.utime(first.directory, (aged, aged))
        assert sender.send({"a"}) == 1
        assert sender.send({"a"}) == 1
        assert sender.send({"a"}) == 1
        assert len(listings) == 3  # quiet and unchanged: the listing is kept
        assert second.start()  # a coordinator that starts later is reached
        assert sender.send({"b"}) == 2
        assert _received(second, got, 10)
        assert {"b"} in got
    finally:
        first.stop()
        second.stop()
    shutil.rmtree(runtime)


class _FakeInfo:
    backend_pid = 111


class _FakeCursor:
    def __init__(self, value: int) -> None:
        self.value = value

    def fetchone(self) -> tuple[int]:
        return (self.value,)


class _FakePooledConnection:
    """What a client of PgBouncer sees: the start-up's pid is the pooler's own."""

    info = _FakeInfo()
    autocommit = False

    def notifies(self) -> None:  # pragma: no cover - never reached
        raise AssertionError

    def rollback(self) -> None:
        pass

    def execute(self, sql: str) -> _FakeCursor:
        assert sql == "SELECT pg_backend_pid()"
        return _FakeCursor(222)


class _FakeProxy:
    driver_connection = _FakePooledConnection()
    closed = False

    def detach(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class _FakeEngine:
    proxy = _FakeProxy()

    def raw_connection(self) -> _FakeProxy:
        return self.proxy


def test_a_listener_behind_a_pooler_gives_up_with_a_reason() -> None:
    engine = _FakeEngine()
    listener = Listener(engine, {"dbworker_x": "x"}, lambda names: None, "me")  # type: ignore[arg-type]
    with pytest.raises(PoolerDetected, match="pooler"):
        listener._connect()
    assert engine.proxy.closed


def test_the_probe_reads_indexes_only_on_a_never_analyzed_history(database_url: str) -> None:
    """An idle worker's poll must not scan: its two probes read index ends, whatever
    the planner knows (nothing, for a table filled a moment ago)."""
    engine = create_engine(database_url)
    Base.metadata.create_all(engine)
    coordinator = coordinator_with_dependents(database_url)
    coordinator.create_worker_tables()
    table = coordinator._registration("wk_thumb").table
    rows = 20_000
    with engine.begin() as conn:
        conn.execute(insert(Album), [{"id": 1, "enabled": True}])
        conn.execute(insert(Photo), [{"id": i, "album_id": 1} for i in range(1, rows + 1)])
        record = {"token": 1, "attempts": 1, "failures": 0, "crashes": 0}
        conn.execute(
            insert(table.table),
            [
                {"source_id": i, "status": "finished", "discovered_at": 0.0, "updated_at": 0.0}
                | record
                for i in range(1, rows + 1)
            ],
        )
    statements: list[str] = []

    def keep(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        statements.append(statement)

    dialect = for_url(database_url)
    with engine.connect() as conn:
        event.listen(conn, "before_cursor_execute", keep)
        assert not dialect.probe(conn, table, rows)
        event.remove(conn, "before_cursor_execute", keep)
        (probe,) = statements
        name = engine.dialect.name
        explain = "EXPLAIN QUERY PLAN " if name == "sqlite" else "EXPLAIN "
        plan = [
            " ".join(str(v) for v in row)
            for row in conn.exec_driver_sql(
                explain + probe, {"above": rows} if name == "postgresql" else (rows,)
            )
        ]
    text = "\n".join(plan)
    scans = {"postgresql": "Seq Scan", "sqlite": "SCAN wk_", "mysql": " ALL "}
    assert scans[name] not in text, text


def test_an_application_coordinator_that_was_dropped_still_announces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The application builds a Coordinator to register its workers and keeps only the
    session factory: its commits must still wake the worker service."""
    runtime = Path(tempfile.mkdtemp(prefix="dbw"))
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(runtime / "run"))
    url = f"sqlite:///{runtime / 'app.db'}"
    engine = create_engine(url)
    Base.metadata.create_all(engine)
    session_factory = sessionmaker(engine)
    coordinator = Coordinator(session_factory, database_url=url)
    coordinator.transactional_worker(name="wk_thumb", source=Photo)(handle)
    identity = for_url(url).identity(coordinator._url)
    del coordinator
    gc.collect()
    got: list[set[str] | None] = []

    def wake(names: set[str] | None) -> None:
        got.append(names)

    receiver = Receiver(identity, wake)
    assert receiver.start()
    try:
        with session_factory.begin() as session:
            session.add(Album(id=1, enabled=True))
            session.flush()
            session.add(Photo(id=1, album_id=1))
        assert _received(receiver, got, 10)
        assert got == [{"wk_thumb"}]
    finally:
        receiver.stop()
        engine.dispose()
        shutil.rmtree(runtime)


@pytest.mark.backends("postgresql")
def test_notifications_that_arrive_together_wake_the_scheduler_once(database_url: str) -> None:
    """A commit to a table several workers watch notifies each one's channel: they
    arrive together and wake the scheduler once, for all of them (woken for the first
    alone, it polled that worker before the others)."""
    engine = create_engine(database_url)
    woken: list[set[str] | None] = []
    listener = Listener(engine, {"wk_a": "a", "wk_b": "b", "wk_c": "c"}, woken.append, "me")
    listener.start()
    try:
        assert listener.listening.wait(10)
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "SELECT pg_notify('wk_a', ''), pg_notify('wk_b', ''), pg_notify('wk_c', 'me')"
            )
        deadline = time.monotonic() + 10
        while not woken and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # a second wake, if any, would come now
    finally:
        listener.stop()
        engine.dispose()
    assert woken == [{"a", "b"}]  # wk_c's was this coordinator's own announcement
