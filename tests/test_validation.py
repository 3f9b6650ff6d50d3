"""Bad input is refused at the earliest moment, with a message that says what is wrong.

Most checks need no database: a Coordinator does not connect until it must, so they
run once. Those that do (start(), handlers that break their contract) run on every
backend with real handler processes.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select, text
from sqlalchemy.orm import Session, sessionmaker

from dbworker import (
    ConfigurationError,
    Coordinator,
    ExecutionStatus,
    HandlerContractError,
    UnknownWorkerError,
)
from dbworker.core.status import Phase
from flows.app import (
    Item,
    Other,
    Output,
    Pair,
    close_handler,
    commit_handler,
    commit_swallowed_handler,
    finish_handler,
    returns_none_handler,
    returns_value_handler,
)
from flows.support import Harness, harness

PG_URL = "postgresql+psycopg://app@db.example:5432/app"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'validation.sqlite'}"


@pytest.fixture
def coordinator(sqlite_url: str) -> Coordinator:
    """A coordinator that is never started: registration checks need no database."""
    return Coordinator(sessionmaker(), database_url=sqlite_url)


@pytest.fixture
def h(database_url: str, tmp_path: Path) -> Iterator[Harness]:
    with harness(database_url, tmp_path) as value:
        yield value


def raises(match: str) -> Any:
    return pytest.raises(ConfigurationError, match=match)


def register(coordinator: Coordinator, name: str = "process", **options: Any) -> None:
    coordinator.transactional_worker(name=name, source=Item, **options)(finish_handler)


# -- worker names ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["Process", "1st", "_private", "with-dash", "with space", "dotted.name", "caf\u00e9", ""],
    ids=repr,
)
def test_worker_name_must_match_the_pattern(coordinator: Coordinator, name: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        coordinator.transactional_worker(name=name, source=Item)
    message = str(raised.value)
    assert f"invalid worker name {name!r}" in message
    assert "must start with a lowercase letter" in message
    assert "only lowercase letters, digits and underscores" in message
    assert coordinator.workers == {}


def test_worker_name_must_be_a_string(coordinator: Coordinator) -> None:
    with raises("worker name must be a str, got 7"):
        coordinator.transactional_worker(name=7, source=Item)  # type: ignore[arg-type]


def test_worker_name_too_long_for_postgresql_identifiers() -> None:
    # Constructing a Coordinator does not connect, so any PostgreSQL URL will do.
    coordinator = Coordinator(sessionmaker(), database_url=PG_URL)
    register(coordinator, name="a" * 44)  # "dbworker_" + 44 + "_status_ix" == 63
    with pytest.raises(ConfigurationError) as raised:
        coordinator.transactional_worker(name="b" * 45, source=Item)
    message = str(raised.value)
    assert f"worker name {'b' * 45!r} is too long for this database's identifiers" in message
    assert "at most 44 characters" in message


@pytest.mark.parametrize("url", ["mysql+mysqldb://root@db/app", "sqlite:///app.db"])
def test_worker_names_fit_every_built_in_database(url: str) -> None:
    # MySQL allows 64-character identifiers and SQLite has no limit, but an
    # application moves from SQLite to PostgreSQL (63) with its worker names.
    coordinator = Coordinator(sessionmaker(), database_url=url)
    register(coordinator, name="a" * 44)
    with raises("is too long: at most 44 characters") as raised:
        coordinator.transactional_worker(name="b" * 45, source=Item)
    assert "PostgreSQL's 63-character identifiers" in str(raised.value)


def test_duplicate_worker_name(coordinator: Coordinator) -> None:
    register(coordinator)
    # Refused when the decorator is made, before a second handler is even given.
    with raises("a worker named 'process' is already registered"):
        coordinator.transactional_worker(name="process", source=Item)
    assert list(coordinator.workers) == ["process"]


def test_duplicate_worker_name_between_decorator_and_handler(coordinator: Coordinator) -> None:
    first = coordinator.transactional_worker(name="process", source=Item)
    second = coordinator.transactional_worker(name="process", source=Item)
    first(finish_handler)
    with raises("a worker named 'process' is already registered"):
        second(finish_handler)


# -- sources -----------------------------------------------------------------------------


def test_source_with_a_composite_primary_key(coordinator: Coordinator) -> None:
    with raises(
        r"source model Pair must have exactly one primary-key column \(it has 2: left, right\)"
    ):
        coordinator.transactional_worker(name="pairs", source=Pair)


@pytest.mark.parametrize(
    "source",
    [object, Item(), Item.__table__, "Item", 42, None, Item.id],
    ids=["plain class", "model instance", "Table", "str", "int", "None", "column"],
)
def test_source_must_be_a_model_class(coordinator: Coordinator, source: object) -> None:
    with raises("source must be a mapped SQLAlchemy model class"):
        coordinator.transactional_worker(name="process", source=source)  # type: ignore[arg-type]
    assert coordinator.workers == {}


# -- database URL ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://",
        "sqlite:///:memory:",
        "sqlite+pysqlite:///:memory:",
        "sqlite:///file::memory:?cache=shared&uri=true",
        "sqlite:///file:shared_mem?mode=memory&cache=shared&uri=true",
    ],
)
def test_in_memory_sqlite_is_refused(url: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        Coordinator(sessionmaker(), database_url=url)
    message = str(raised.value)
    assert "in-memory SQLite database cannot be shared with worker processes" in message
    assert "use a file-backed database" in message


def test_unparseable_database_url() -> None:
    with raises("invalid database_url 'not a url'"):
        Coordinator(sessionmaker(), database_url="not a url")


def test_database_without_a_dialect() -> None:
    with raises("dbworker has no dialect for the 'oracle' database; supported: "):
        Coordinator(sessionmaker(), database_url="oracle://scott@db/orcl")


def test_session_factory_must_be_callable(sqlite_url: str) -> None:
    with raises("session_factory must be a SQLAlchemy sessionmaker"):
        Coordinator(object(), database_url=sqlite_url)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("app_url", "worker_url"),
    [
        (PG_URL, "postgresql+psycopg://app@db.example:5432/other"),
        (PG_URL, "postgresql+psycopg://app@elsewhere.example:5432/app"),
        (PG_URL, "postgresql+psycopg://app@db.example:5433/app"),
        (PG_URL, "mysql+mysqldb://app@db.example:5432/app"),
    ],
    ids=["database", "host", "port", "backend"],
)
def test_database_url_of_another_database_than_the_session_factory(
    app_url: str, worker_url: str
) -> None:
    engine = create_engine(app_url)  # never connects
    with pytest.raises(ConfigurationError) as raised:
        Coordinator(sessionmaker(engine), database_url=worker_url)
    message = str(raised.value)
    assert "point at different databases" in message
    assert "database_url (" in message and "session factory's engine (" in message


def test_database_url_of_another_sqlite_file(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'app.sqlite'}")
    with raises("point at different databases"):
        Coordinator(sessionmaker(engine), database_url=f"sqlite:///{tmp_path / 'other.sqlite'}")


def test_database_url_message_hides_the_password() -> None:
    engine = create_engine("postgresql+psycopg://app:s3cret@db.example/app")
    with pytest.raises(ConfigurationError) as raised:
        Coordinator(
            sessionmaker(engine), database_url="postgresql+psycopg://app:s3cret@db.example/other"
        )
    assert "s3cret" not in str(raised.value)


@pytest.mark.parametrize(
    ("app_url", "worker_url"),
    [
        ("postgresql+psycopg://app@localhost/app", "postgresql://app@127.0.0.1:5432/app"),
        ("mysql+pymysql://root@127.0.0.1/app", "mariadb+mysqldb://root@localhost:3306/app"),
    ],
    ids=["postgresql", "mysql"],
)
def test_spellings_of_the_same_database_are_accepted(app_url: str, worker_url: str) -> None:
    # A driver, a default port written out, localhost for 127.0.0.1: still one database.
    Coordinator(sessionmaker(create_engine(app_url)), database_url=worker_url)


def test_relative_and_absolute_sqlite_paths_of_one_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    engine = create_engine("sqlite:///app.sqlite")
    Coordinator(sessionmaker(engine), database_url=f"sqlite:///{tmp_path / 'app.sqlite'}")


# -- handlers ----------------------------------------------------------------------------


def make_nested_handler() -> Any:
    def nested(source: Item, session: Session) -> None:
        return None

    return nested


class Handlers:
    def method(self, source: Item, session: Session) -> None:
        return None


@pytest.mark.parametrize(
    "handler",
    [
        lambda source, session: None,
        make_nested_handler(),
        functools.partial(finish_handler),
        Handlers().method,
        print,
    ],
    ids=["lambda", "nested function", "partial", "bound method", "builtin"],
)
def test_handler_must_be_importable_by_child_processes(
    coordinator: Coordinator, handler: Any
) -> None:
    decorator = coordinator.transactional_worker(name="process", source=Item)
    with pytest.raises(ConfigurationError) as raised:
        decorator(handler)
    message = str(raised.value)
    assert "cannot be imported by worker processes" in message
    assert "module scope" in message
    assert coordinator.workers == {}


def test_handler_must_be_callable(coordinator: Coordinator) -> None:
    with raises("handler must be callable, got 42"):
        coordinator.transactional_worker(name="process", source=Item)(42)  # type: ignore[call-overload]


# -- eligible ------------------------------------------------------------------------------


def test_eligible_must_be_callable(coordinator: Coordinator) -> None:
    with raises("eligible must be a callable returning a select"):
        coordinator.transactional_worker(
            name="process",
            source=Item,
            eligible=select(Item),  # type: ignore[arg-type]
        )


@pytest.mark.parametrize(
    ("eligible", "selected"),
    [
        (lambda: select(Other), "Other"),
        (lambda: select(Item, Other).join(Other, Other.id == Item.id), "Item, Other"),
        (lambda: select(Output).where(Output.item_id == 1), "Output"),
    ],
    ids=["other model", "two models", "related model"],
)
def test_eligible_selecting_another_model_fails_at_start(
    coordinator: Coordinator, eligible: Any, selected: str
) -> None:
    register(coordinator, eligible=eligible)  # eligible may use workers registered later
    with pytest.raises(ConfigurationError) as raised:
        coordinator.start()
    message = str(raised.value)
    assert "eligible of worker 'process' must select Item entities" in message
    assert f"but it selects {selected}" in message
    assert not coordinator.running


@pytest.mark.parametrize(
    ("eligible", "got"),
    [
        (lambda: text("SELECT id FROM flow_item"), "TextClause"),
        (lambda: "SELECT * FROM flow_item", "str"),
        (lambda: None, "NoneType"),
        (lambda: select(Item).subquery(), "Subquery"),
        (lambda: Item.enabled.is_(True), "BinaryExpression"),
    ],
    ids=["text", "str", "None", "subquery", "condition"],
)
def test_eligible_returning_a_non_select_fails_at_start(
    coordinator: Coordinator, eligible: Any, got: str
) -> None:
    register(coordinator, eligible=eligible)
    with raises(f"eligible of worker 'process' must return a select\\(...\\) statement, got {got}"):
        coordinator.start()
    assert not coordinator.running


# -- numbers -------------------------------------------------------------------------------


@pytest.mark.parametrize("concurrency", [0, -1, 1.5, "2", True, None], ids=repr)
def test_concurrency_must_be_a_positive_int(coordinator: Coordinator, concurrency: Any) -> None:
    with raises(f"concurrency must be an int >= 1, got {re.escape(repr(concurrency))}"):
        coordinator.transactional_worker(name="process", source=Item, concurrency=concurrency)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lease_seconds": 0}, "lease_seconds must be a finite number > 0, got 0"),
        ({"lease_seconds": -5}, "lease_seconds must be a finite number > 0, got -5"),
        ({"lease_seconds": math.inf}, "lease_seconds must be a finite number > 0, got inf"),
        ({"lease_seconds": 0.5}, "lease_seconds must be at least 1 second"),
        ({"lease_seconds": "30"}, "lease_seconds must be a number of seconds, got '30'"),
        ({"poll_seconds": 0}, "poll_seconds must be a finite number > 0, got 0"),
        ({"poll_seconds": -0.1}, "poll_seconds must be a finite number > 0"),
        ({"poll_seconds": math.nan}, "poll_seconds must be a finite number > 0, got nan"),
        ({"poll_seconds": None}, "poll_seconds must be a number of seconds, got None"),
        ({"max_poll_seconds": 0}, "max_poll_seconds must be a finite number > 0"),
        ({"max_poll_seconds": True}, "max_poll_seconds must be a number of seconds, got True"),
        (
            {"poll_seconds": 2, "max_poll_seconds": 1},
            r"max_poll_seconds \(1\) must be >= poll_seconds \(2\)",
        ),
    ],
    ids=lambda value: repr(value) if isinstance(value, dict) else "",
)
def test_invalid_timings(sqlite_url: str, options: dict[str, Any], message: str) -> None:
    with raises(message):
        Coordinator(sessionmaker(), database_url=sqlite_url, **options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"timeout": 0}, "timeout must be a finite number > 0"),
        ({"timeout": "10"}, "timeout must be a number of seconds"),
        ({"retry": 3}, "retry must be a RetryPolicy, got 3"),
        ({"max_crashes": 0}, "max_crashes must be an int >= 1, got 0"),
        ({"max_crashes": 2.5}, "max_crashes must be an int >= 1, got 2.5"),
    ],
    ids=lambda value: repr(value) if isinstance(value, dict) else "",
)
def test_invalid_worker_options(
    coordinator: Coordinator, options: dict[str, Any], message: str
) -> None:
    with raises(message):
        coordinator.transactional_worker(name="process", source=Item, **options)


def test_stop_timeout_must_be_a_non_negative_number(coordinator: Coordinator) -> None:
    with raises("timeout must be a number >= 0, got -1"):
        coordinator.stop(timeout=-1)


# -- worker names in status queries ----------------------------------------------------------------


def test_unknown_worker_in_execution_status(coordinator: Coordinator) -> None:
    register(coordinator)
    with pytest.raises(UnknownWorkerError) as raised, Session() as session:
        coordinator.execution_status(session, worker="proces", source_id=1)
    assert isinstance(raised.value, KeyError)
    assert str(raised.value) == "no worker named 'proces' is registered (registered: process)"


def test_unknown_worker_in_has_execution_status(coordinator: Coordinator) -> None:
    with pytest.raises(UnknownWorkerError, match=r"no worker named 'process' .*registered: none"):
        coordinator.has_execution_status(
            worker="process", source_id=Item.id, statuses=(ExecutionStatus.FINISHED,)
        )


def test_unknown_worker_in_workers_mapping(coordinator: Coordinator) -> None:
    register(coordinator)
    with pytest.raises(KeyError) as raised:
        coordinator.workers["nope"]
    assert isinstance(raised.value, UnknownWorkerError)
    assert "no worker named 'nope' is registered (registered: process)" in str(raised.value)
    # Still an ordinary read-only mapping.
    assert "nope" not in coordinator.workers
    assert coordinator.workers.get("nope") is None
    assert list(coordinator.workers) == ["process"]
    with pytest.raises(TypeError):
        coordinator.workers["x"] = coordinator.workers["process"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("statuses", "message"),
    [
        ("finished", "statuses must be a collection of ExecutionStatus members"),
        (ExecutionStatus.FINISHED, r"e\.g\. \(ExecutionStatus\.FINISHED,\)"),
        (None, "statuses must be a collection of ExecutionStatus members, .* got None"),
        (["finished"], "statuses must be ExecutionStatus members, got 'finished'"),
        ((ExecutionStatus.FINISHED, Phase.PENDING), "must be ExecutionStatus members, got <Phase"),
        ((), "statuses must name at least one ExecutionStatus"),
    ],
    ids=["str", "lone status", "None", "list of str", "internal phase", "empty"],
)
def test_statuses_must_be_execution_statuses(
    coordinator: Coordinator, statuses: Any, message: str
) -> None:
    register(coordinator)
    with raises(message):
        coordinator.has_execution_status(worker="process", source_id=Item.id, statuses=statuses)


# -- lifecycle without a database ------------------------------------------------------------


def test_start_and_create_tables_need_workers(coordinator: Coordinator) -> None:
    with raises("register at least one worker before start"):
        coordinator.start()
    with raises("register workers before create_worker_tables"):
        coordinator.create_worker_tables()


# -- lifecycle with a database -------------------------------------------------------------


def test_start_before_create_worker_tables_names_the_table(h: Harness) -> None:
    coordinator = h.coordinator()
    register(coordinator, concurrency=2)
    with pytest.raises(ConfigurationError) as raised:
        coordinator.start()
    message = str(raised.value)
    assert "the table dbworker_process of worker 'process' does not exist" in message
    assert "coordinator.create_worker_tables()" in message
    assert not coordinator.running
    coordinator.stop()  # nothing to stop; must not fail

    # A failed start leaves the coordinator as it was: fix the cause, start again.
    coordinator.create_worker_tables()
    h.insert(1)
    coordinator.start()
    h.wait_for_status(coordinator, "process", [1], ExecutionStatus.FINISHED)


def test_registration_and_start_after_start_are_refused(h: Harness) -> None:
    coordinator = h.coordinator()
    register(coordinator)
    coordinator.create_worker_tables()
    coordinator.start()
    with raises("cannot register a worker after start"):
        coordinator.transactional_worker(name="late", source=Item)
    with raises("cannot start after start"):
        coordinator.start()
    assert list(coordinator.workers) == ["process"]


@pytest.mark.backends("sqlite")
def test_database_url_without_the_worker_tables_is_found_at_start(
    h: Harness, tmp_path: Path
) -> None:
    # A session factory that is not a bound sessionmaker cannot be compared by URL;
    # start() still notices that database_url is another database.
    engine = h.engine

    def session_factory() -> Session:
        return Session(engine)

    other = f"sqlite:///{tmp_path / 'other.sqlite'}"
    coordinator = Coordinator(session_factory, database_url=other, lease_seconds=10)
    h.coordinators.append(coordinator)
    register(coordinator)
    coordinator.create_worker_tables()
    with pytest.raises(ConfigurationError) as raised:
        coordinator.start()
    message = str(raised.value)
    assert "has no table dbworker_process" in message
    assert "point at different databases" in message
    assert not coordinator.running


# -- handlers that break their contract -------------------------------------------------------


def only(*ids: int) -> Any:
    return lambda: select(Item).where(Item.id.in_(ids)).order_by(Item.id)


def test_handler_returning_something_else_fails(h: Harness) -> None:
    coordinator = h.coordinator()
    # Wrong on purpose: the type checker refuses both, the runtime must too.
    coordinator.transactional_worker(name="bad_value", source=Item, eligible=only(1, 2, 3))(
        returns_value_handler  # type: ignore[type-var]
    )
    coordinator.transactional_worker(name="bad_none", source=Item, eligible=only(4))(
        returns_none_handler  # type: ignore[type-var]
    )
    h.insert(1, 2, 3, 4)
    coordinator.create_worker_tables()
    coordinator.start()
    h.wait_for_status(coordinator, "bad_value", [1, 2, 3], ExecutionStatus.FAILED)
    h.wait_for_status(coordinator, "bad_none", [4], ExecutionStatus.FAILED)

    returned = {1: "<class 'dbworker.core.outcomes.Finished'>", 2: "True", 3: "'finished'"}
    for item_id, worker, value in [
        *((i, "bad_value", r) for i, r in returned.items()),
        (4, "bad_none", "None"),
    ]:
        state = h.state(coordinator, worker, item_id)
        assert state is not None
        assert state["error"] == (
            f"HandlerContractError: handler of worker {worker!r} returned {value}; "
            "it must return Finished() or Unfinished()"
        )
        assert h.item(item_id).result is None  # its writes rolled back
        assert h.runs("bad", item_id) == 1  # not retried


def test_handler_that_commits_or_closes_the_session_fails(h: Harness) -> None:
    coordinator = h.coordinator()
    for name, handler, ids in [
        ("commits", commit_handler, (1,)),
        ("hides_commit", commit_swallowed_handler, (2,)),
        ("closes", close_handler, (3,)),
    ]:
        coordinator.transactional_worker(name=name, source=Item, eligible=only(*ids))(handler)
    h.insert(1, 2, 3)
    coordinator.create_worker_tables()
    coordinator.start()
    for name, item_id in [("commits", 1), ("hides_commit", 2), ("closes", 3)]:
        h.wait_for_status(coordinator, name, [item_id], ExecutionStatus.FAILED)

    expected = {
        ("commits", 1): "HandlerContractError: do not commit the session dbworker gives a handler",
        ("hides_commit", 2): (
            "HandlerContractError: the handler called session.commit(); dbworker owns the "
            "session's commit and cleanup"
        ),
        ("closes", 3): "HandlerContractError: do not close the session dbworker gives a handler",
    }
    for (name, item_id), message in expected.items():
        state = h.state(coordinator, name, item_id)
        assert state is not None and state["error"] is not None
        assert state["error"].startswith(message), state["error"]
        assert h.item(item_id).result is None
    with h.session_factory() as session:
        assert session.scalars(select(Output)).all() == []
    assert issubclass(HandlerContractError, TypeError)
