"""The dialect interface: what a database provides, and the capabilities it declares.

A dialect turns the transitions of ``core.transitions`` into SQL for one database. The
engine (the coordinator's loop, the handler processes, the operators' reads) calls the
operations of ``Dialect`` (``base.py``), whose SQL is written once, in parts:

- ``claiming.py``: ``claimable``, ``candidates``, ``lock_candidates``, ``claim``;
- ``discovery.py``: ``discover``, ``discover_to_watermark``, ``sweep``, ``probe``,
  ``watermark``;
- ``fenced.py``: ``renew``, ``finish``, ``unfinish``, ``fail``, ``release``, ``record``,
  ``reset_failed``, ``current_token``: the fenced transitions, never a database's to
  write again;
- ``reading.py``: ``status_condition``, ``read_status``, ``read_state``, ``counts``,
  ``failed``.

What differs from one database to the next is declared here, in one place. Two methods
have no shared version that could serve every database, so they are abstract:
``db_now`` (the database's clock as SQL) and ``insert_ignore`` (an INSERT that skips
existing keys). The others have the shared SQL as their default, and a database
overrides them where it differs: ``validate_url``, ``same_database``, ``identity``,
``configure_engine``, ``reset_session``, ``coordinator_engine_options``,
``is_transient`` and ``whole_minutes`` (below), and the claim and discovery strategy,
``candidates``, ``lock_candidates``, ``claim`` and ``_discover_above_watermark``
(in their parts). Optional behaviour is a class flag (SQLAlchemy's ``supports_*``
style), which the shared SQL reads; it never asks which methods a class replaced.

An abstract base class rather than a ``typing.Protocol``: the registry, the engine and
the handler processes take ``Dialect`` subclasses, and a third party writes one by
subclassing a built-in or ``Dialect``, which brings the shared SQL along. A Protocol
would be a second type that nothing is typed against; an abstract method instead names
what a new database forgot when its class is instantiated, before any SQL runs.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

from sqlalchemy import ColumnElement, Connection, Engine, Float, Select, Table, func, literal
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL
from sqlalchemy.sql.dml import Insert

from .driver_cursor import DriverForms, all_rows, rowcount
from .liveness import ping_when_idle
from .rate_slots import RateState
from .terms import Clock

#: Host names that mean this machine.
_LOOPBACK = frozenset({"", "localhost", "127.0.0.1", "::1"})


class DialectInterface(ABC):
    """What a database provides: its clock, its insert-or-ignore, how its connections
    are set up and judged, and the capabilities it declares (the flags below)."""

    #: The SQLAlchemy backend names (``URL.get_backend_name()``) this dialect serves.
    backend_names: ClassVar[tuple[str, ...]] = ()
    #: Whether two coordinator transactions can claim at the same time.
    supports_concurrent_claims: ClassVar[bool] = True
    #: Whether ``claim`` may search, lock and update in one statement of its own, built
    #: over ``candidates``, without calling ``lock_candidates``. A subclass that defines
    #: ``lock_candidates`` and does not declare this flag again gets False, so that its
    #: own locking is what claims (``Dialect.__init_subclass__``).
    supports_one_statement_claims: ClassVar[bool] = False
    #: Whether ``discover_to_watermark`` may take the watermark from what the shared
    #: discovery read rather than from a second ``max()``. A subclass that defines
    #: ``discover`` and does not declare this flag again gets False: its discovery
    #: runs, followed by a read of the watermark.
    supports_discovery_watermark: ClassVar[bool] = True
    #: Whether ``discover_for_claim`` prepares the claim that follows in discovery's own
    #: statement (PostgreSQL: its plan guard, a round trip less). A subclass that
    #: defines ``discover``, ``discover_to_watermark`` or ``_discover_above_watermark``
    #: and does not declare this flag again gets False: its discovery runs as written.
    prepares_claim_in_discovery: ClassVar[bool] = False
    #: Whether discovery runs as one ``INSERT ... SELECT ... RETURNING`` that reads the
    #: watermark from the table it inserts into (``_discover_returning``), where the
    #: driver has RETURNING. On by choice of each dialect, as measured (SQLite).
    watermark_read_in_insert: ClassVar[bool] = False
    #: Whether discovery's ``INSERT ... SELECT`` (bounded by the watermark read before
    #: it) returns the keys it added, where the driver has RETURNING: the largest is the
    #: new watermark, which a second read would otherwise fetch (MariaDB).
    discovery_returns_keys: ClassVar[bool] = False
    #: Whether a new connection's first statements pay for loading what they read
    #: into a new server session (PostgreSQL: a new backend process, empty caches).
    new_connection_is_cold: ClassVar[bool] = False
    #: Whether a connection's session can pass from one handler process to a later
    #: one (a fork inherits the socket; ``reset_session`` clears what the first left).
    sessions_outlive_processes: ClassVar[bool] = False
    #: The server's port where a URL leaves it out (None: no server).
    default_port: ClassVar[int | None] = None
    #: Whether a handler process reads the source row apart, before the handler's
    #: transaction: in one statement outside any transaction, on a connection with
    #: ``READ_ONLY_OPTION`` (the dialect's driver connections must be in autocommit).
    source_read_apart: ClassVar[bool] = False
    #: Whether a failed statement aborts its whole transaction (PostgreSQL), rather
    #: than that statement only: a read that may fail after a claim then needs a
    #: savepoint of its own (``Scheduler._rows_of``).
    failed_statement_aborts_transaction: ClassVar[bool] = False
    #: Whether the database delivers transactional notifications (NOTIFY/LISTEN), with
    #: which writers wake coordinators on other hosts (dbworker.wakeups).
    supports_notify: ClassVar[bool] = False
    #: Whether a handler process may run consecutive short items in one transaction, a
    #: savepoint each, with one commit (``invocation/group.py``): worth it where a
    #: commit costs a round trip and a flush to disk.
    supports_group_commit: ClassVar[bool] = True
    #: Where items do not go in one transaction (``supports_group_commit`` off): whether
    #: a handler process may still record the FINISHes of consecutive short items that
    #: wrote nothing in one statement of its own, once after them (``finish_all_alone``,
    #: ``invocation/lone_finishes.py``).
    groups_lone_finishes: ClassVar[bool] = False
    #: How many candidate rows a discovery or sweep round reads at most. A round holds
    #: the scheduler up for its length: 250 (2-4 ms on PostgreSQL under load) fits in
    #: what a handler process's pipe holds, where 1,000 (10-20 ms) emptied them.
    discovery_batch: ClassVar[int] = 250
    #: Through a backlog, whether the scheduler runs the next discovery round ahead of
    #: the claims, on passes that do not poll the worker (``scheduling/discovery.py``).
    discovers_ahead: ClassVar[bool] = True

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock
        # SQL expressions are immutable, and building them is most of a claim's
        # Python time: the clock and each table's claim condition are built once.
        self._db_clock: ColumnElement[float] | None = None
        self._built: dict[tuple[Any, ...], Any] = {}
        #: Built-once statements compiled for a driver, per key and SQLAlchemy dialect.
        self._driver_forms = DriverForms()
        #: Rate slots seen, where one claimer runs at a time (``rate_slots``).
        self._rate_state = RateState()
        #: Whether this coordinator's tasks may run in groups: the dialect's
        #: ``supports_group_commit``, unless its server said otherwise (``learn_server``).
        self.group_commit = self.supports_group_commit

    # -- time ----------------------------------------------------------------------

    @abstractmethod
    def db_now(self) -> ColumnElement[float]:
        """The database's current time as epoch seconds (SQL), read when the statement
        runs rather than when its transaction began: leases are measured from it."""

    def now(self) -> ColumnElement[float]:
        """The current time as SQL: the database's clock, or the injected test clock."""
        if self.clock is not None:
            return literal(self.clock(), Float())
        if self._db_clock is None:
            self._db_clock = self.db_now()
        return self._db_clock

    def whole_minutes(self, seconds: ColumnElement[float]) -> ColumnElement[Any]:
        """SQL for the whole minutes in a non-negative number of ``seconds``."""
        return func.floor(seconds / 60)

    def _eligible_cache_key(self, key: tuple[Any, ...], eligible: Select[Any]) -> Any:
        """``eligible``'s SQLAlchemy cache key, kept with the last query seen under
        ``key``: a worker without ``eligible=`` claims with the same query object each
        time, whose key (about 30 us to build) cannot change."""
        seen = self._built.get(("cache key of", *key))
        if seen is not None and seen[0] is eligible:
            return seen[1]
        cache_key = eligible._generate_cache_key()
        self._built[("cache key of", *key)] = (eligible, cache_key)
        return cache_key

    def _built_once(self, key: tuple[Any, ...], build: Callable[[], Any]) -> Any:
        """``build()``'s SQL, kept under ``key`` while "now" is the database's clock (a
        test clock's is a literal that changes, so its SQL is built each time)."""
        if self.clock is not None:
            return build()
        built = self._built.get(key)
        if built is None:
            built = self._built[key] = build()
        return built

    def _rows_of(
        self, conn: Connection, key: Any, statement: Any, params: dict[str, Any]
    ) -> list[tuple[Any, ...]]:
        """``statement``'s rows (a built-once statement, kept under ``key``), on the
        driver's cursor where it has a form of its own: around a claim's statements,
        SQLAlchemy's execution costs about as much as SQLite's work (a lock of 16 keys'
        slots: 40% of a claim's time under the write lock, its SQL included)."""
        driver = None if self.clock is not None else self._driver_forms.get(conn, key, statement)
        if driver is None:
            return [tuple(row) for row in conn.execute(statement, params)]
        return all_rows(conn, driver, params)

    def _matched(
        self, conn: Connection, key: tuple[Any, ...], statement: Any, params: dict[str, Any]
    ) -> int:
        """The rows a built-once statement matched, run on the driver's cursor unless
        someone watches statements (``driver_cursor``: a handler's finish is one)."""
        driver = None if self.clock is not None else self._driver_forms.get(conn, key, statement)
        if driver is not None:
            return rowcount(conn, driver, params)
        return int(conn.execute(statement, params).rowcount)

    # -- writing -------------------------------------------------------------------

    @abstractmethod
    def insert_ignore(self, table: Table, keys: Sequence[str] = ("source_id",)) -> Insert:
        """An INSERT that skips rows whose key exists (another coordinator found them):
        ``keys``, the columns of the table's primary key or a unique constraint."""

    # -- connections ---------------------------------------------------------------

    def validate_url(self, url: URL) -> None:
        """Reject URLs this database cannot coordinate through (e.g. in-memory SQLite)."""
        return None  # any URL SQLAlchemy accepts, unless the database says otherwise

    def same_database(self, ours: URL, theirs: URL) -> bool:
        """Whether two URLs of this database plausibly name one database.

        Only clear mismatches count: spellings of one database (a driver, an omitted
        default port, "localhost" for 127.0.0.1) must not stop a coordinator from
        being built.
        """

        def host(url: URL) -> str:
            name = (url.host or "").lower()
            return "localhost" if name in _LOOPBACK else name

        def port(url: URL) -> int | None:
            return url.port or self.default_port

        return (
            host(ours) == host(theirs)
            and port(ours) == port(theirs)
            and (ours.database or "") == (theirs.database or "")
        )

    def identity(self, url: URL) -> str:
        """One spelling of the database ``url`` names, the same wherever it is spelled
        alike by ``same_database``: writers and coordinators on one host meet under it."""
        host = (url.host or "").lower()
        host = "localhost" if host in _LOOPBACK else host
        port = url.port or self.default_port
        return f"{url.get_backend_name()}://{host}:{port}/{url.database or ''}"

    def configure_engine(self, engine: Engine, handlers: bool = False) -> None:
        """Set up an engine dbworker created itself (coordinator or child process;
        ``handlers``: one whose connections only run invocations, in a handler process,
        where the coordinator bounds how long each may take).

        Overrides call this too: its pooled connections are checked after idling, so
        that a restarted server or an idle timeout costs no transaction an error.
        """
        ping_when_idle(engine)

    def learn_server(self, conn: Connection) -> None:
        """What the coordinator's ``start()`` learns of the server before any claim, on
        one of its connections (by default nothing)."""
        return None

    def configure_async_engine(self, engine: Engine) -> None:
        """Set up the synchronous core (``AsyncEngine.sync_engine``) of an async engine
        whose connections run ``async def`` handlers, many at once on one event loop."""
        self.configure_engine(engine, handlers=True)

    def reset_session(self, conn: Connection) -> None:
        """Return the session to its state just after connecting (no transaction open).
        Needed where ``sessions_outlive_processes``."""
        raise NotImplementedError(f"{type(self).__name__} cannot reset a session")

    def autocommitting(self, conn: Connection) -> AbstractContextManager[bool]:
        """Within it, each statement sent on ``conn``'s driver connection is a transaction
        of its own, with no BEGIN and no COMMIT sent around it (the context yields True),
        where the driver allows it without a round trip and that connection holds no
        transaction; otherwise (False) statements run in its transaction as usual. A
        statement that reads consistently by itself, or a fenced write that is all its
        transaction would hold, costs one round trip then instead of three."""
        return contextlib.nullcontext(False)

    def scheduler_connection(self, conn: Connection) -> None:
        """Set up ``conn``, the connection the coordinator's scheduler keeps for its
        transactions (discovery and claims above all), as it takes it from the pool
        (holding no transaction). By default nothing. A dialect may make a claim or a
        discovery sent there as its transaction's first statement commit by itself
        (PostgreSQL does): the scheduler never rolls a claim back, and nothing else may
        claim on such a connection in a transaction it might roll back."""
        return None

    def release_scheduler_connection(self, conn: Connection) -> None:
        """Before the scheduler lets ``conn`` go (after an error, or as it stops): undo
        what ``scheduler_connection`` set up, so that nothing of it reaches the pool's
        other users. By default nothing."""
        return None

    def coordinator_engine_options(self) -> dict[str, Any]:
        """Options merged under the user's ``engine_options`` for the coordinator's engine
        (child processes use the user's options alone: handlers get the app's defaults)."""
        return {}

    def is_contention(self, error: BaseException) -> bool:
        """Whether ``error`` says the transaction lost to a concurrent one (a deadlock, a
        serialization failure, a Galera certification conflict): retrying at once is
        the remedy, and nothing is wrong with the database."""
        return False

    def is_transient(self, error: BaseException) -> bool:
        """Whether retrying the same work later can succeed (lost connection, deadlock,
        lock timeout, busy database), as opposed to a bug or a schema problem."""
        if isinstance(error, sa_exc.DBAPIError) and error.connection_invalidated:
            return True
        return isinstance(error, sa_exc.OperationalError | sa_exc.InterfaceError)
