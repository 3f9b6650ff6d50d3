"""A registered worker: its handler, its source, its eligibility rule and its table.

``Registration`` is what the coordinator, the scheduler and ``drain`` work with;
``Worker`` is the read-only view users get from ``coordinator.workers[name]``, and
``RegisteredWorkers`` that mapping.
"""

from __future__ import annotations

import inspect as pyinspect
import pickle
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast, overload

from sqlalchemy import ColumnElement, Connection, Integer, Select, Table, inspect, select
from sqlalchemy.engine import URL
from sqlalchemy.exc import NoInspectionAvailable
from sqlalchemy.orm import Mapper, Session

from .core.errors import ConfigurationError, UnknownWorkerError
from .core.names import check_portable_length, validate_worker_name
from .core.outcomes import Outcome
from .core.schedules import Schedule
from .core.status import ExecutionStatus
from .core.tasks import Task
from .core.timing import RetryPolicy, require_positive
from .dialects import Claim, Dialect, WorkerTable
from .executors import ExecutorChoice, Pool
from .invocation.loading import SourceLoader
from .limit_options import check_limits
from .records import ExecutionState, FailedItem
from .schema import execution_table

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

Handler = Callable[[Any, Session], Any]
Eligible = Callable[[], Select[Any]]

#: The source model a worker's handler receives, and what the handler returns: a
#: registration decorator is generic over both, so a type checker refuses a handler
#: that takes another model, or the wrong session, or may return None.
SourceModel = TypeVar("SourceModel")
OutcomeType = TypeVar("OutcomeType", bound=Outcome)


class HandlerDecorator(Protocol[SourceModel]):
    """What ``transactional_worker`` and ``periodic_worker`` return: a decorator taking
    a handler, ``def (source, Session)`` or ``async def (source, AsyncSession)``
    returning ``Finished()`` or ``Unfinished()``, and returning it unchanged."""

    @overload
    def __call__(
        self, handler: Callable[[SourceModel, Session], OutcomeType]
    ) -> Callable[[SourceModel, Session], OutcomeType]: ...

    @overload
    def __call__(
        self, handler: Callable[[SourceModel, AsyncSession], Awaitable[OutcomeType]]
    ) -> Callable[[SourceModel, AsyncSession], Awaitable[OutcomeType]]: ...


#: Crashes (process deaths, expired leases) after which an item ends FAILED.
DEFAULT_MAX_CRASHES = 3


def source_mapper(source: object) -> Mapper[Any]:
    try:
        mapper = inspect(source)
    except NoInspectionAvailable:
        mapper = None
    if not isinstance(mapper, Mapper) or mapper.class_ is not source:
        raise ConfigurationError(f"source must be a mapped SQLAlchemy model class, got {source!r}")
    if len(mapper.primary_key) != 1:
        keys = ", ".join(c.name for c in mapper.primary_key)
        raise ConfigurationError(
            f"source model {mapper.class_.__name__} must have exactly one primary-key column "
            f"(it has {len(mapper.primary_key)}: {keys})"
        )
    return mapper


def check_importable(handler: object) -> None:
    """Child processes find the handler by module and qualified name, as pickle does."""
    if not callable(handler):
        raise ConfigurationError(f"handler must be callable, got {handler!r}")
    qualname = getattr(handler, "__qualname__", "")
    if not pyinspect.isfunction(handler) or "<" in qualname:
        raise ConfigurationError(
            f"handler {qualname or handler!r} cannot be imported by worker processes: "
            "define it with def at module scope (not a lambda, a nested function or a "
            "method)"
        )


def check_picklable(name: str, handler: object) -> None:
    try:
        restored = pickle.loads(pickle.dumps(handler))
    except Exception as exc:
        raise ConfigurationError(
            f"handler of worker {name!r} cannot be imported by worker processes ({exc}); "
            "define it at module scope in an importable module"
        ) from exc
    if restored is not handler:
        raise ConfigurationError(
            f"handler of worker {name!r} is not what its module exposes under "
            f"{getattr(handler, '__qualname__', handler)!r}; do not rebind the decorated name"
        )


def check_concurrency(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"concurrency must be an int >= 1, got {value!r}")
    return value


def check_options(
    url: URL,
    name: str,
    eligible: object,
    concurrency: object,
    timeout: float | None,
    retry: object,
    max_crashes: object,
) -> None:
    """``transactional_worker``'s arguments, checked before it returns the decorator."""
    sql_dialect = url.get_dialect()
    # The longest derived name is an index's; MySQL limits those to 64 characters
    # while SQLAlchemy reports its (alias) identifier limit as 255.
    limits = (sql_dialect.max_identifier_length, sql_dialect.max_index_name_length)
    max_length = min((n for n in limits if n), default=63)
    validate_worker_name(name, max_length)
    check_portable_length(name)
    check_concurrency(concurrency)
    if eligible is not None and not callable(eligible):
        raise ConfigurationError("eligible must be a callable returning a select(...) statement")
    if timeout is not None:
        require_positive("timeout", timeout)
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ConfigurationError(f"retry must be a RetryPolicy, got {retry!r}")
    if isinstance(max_crashes, bool) or not isinstance(max_crashes, int) or max_crashes < 1:
        raise ConfigurationError(f"max_crashes must be an int >= 1, got {max_crashes!r}")


@dataclass(eq=False)
class Registration:
    """One ``transactional_worker`` registration, as dbworker uses it internally."""

    name: str
    handler: Handler
    source: type[Any]
    eligible: Eligible | None
    concurrency: int
    dialect: Dialect
    timeout: float | None = None
    retry: RetryPolicy | None = None
    max_crashes: int = DEFAULT_MAX_CRASHES
    executor: ExecutorChoice = field(default_factory=Pool)
    #: A periodic worker's schedule (``periodic_worker``); None for the others.
    schedule: Schedule | None = None
    #: Which source rows are this worker's, for discovery (``WorkerTable.source_filter``).
    source_filter: ColumnElement[bool] | None = None
    #: Per-key exclusivity and rate limits, as given (``limit_options``).
    exclusive_by: Any = None
    rate_limit: str | None = None
    rate_limit_by: Any = None
    table: WorkerTable = field(init=False)
    #: The query of a worker without ``eligible``, built once: the same object at every
    #: claim, whose statement the dialect then finds without building its cache key.
    _default_eligible: Select[Any] | None = field(default=None, init=False, repr=False)
    #: Reads source rows for tasks that carry them (``source_rows``), made at first use.
    _loader: SourceLoader | None = field(default=None, init=False, repr=False)
    #: A read of ``source_rows`` failed for good (``stop_reading_rows``).
    _rows_stopped: bool = field(default=False, init=False, repr=False)
    #: Some query reads its records' status (``has_status``): a finish here may make
    #: items eligible, its own worker's included.
    status_read: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        mapper = source_mapper(self.source)
        pk = mapper.primary_key[0]
        metadata = pk.table.metadata  # the source table's MetaData: Alembic sees ours too
        limits = check_limits(pk.table, self.exclusive_by, self.rate_limit, self.rate_limit_by)
        keyed = limits is not None and limits.keyed
        table = execution_table(self.name, pk.type, metadata, keyed=keyed)
        self.table = WorkerTable(
            self.name, table, pk, isinstance(pk.type, Integer), self.source_filter, limits
        )

    # -- the eligible query ------------------------------------------------------

    def eligible_query(self) -> Select[Any]:
        """Call ``eligible`` and check that it selects the source model."""
        if self.eligible is None:
            if self._default_eligible is None:
                self._default_eligible = select(self.source).order_by(self.table.source_pk)
            return self._default_eligible
        query = self.eligible()
        if not isinstance(query, Select):
            raise ConfigurationError(
                f"eligible of worker {self.name!r} must return a select(...) statement, "
                f"got {type(query).__name__}"
            )
        descriptions = query.column_descriptions
        entity = descriptions[0].get("entity") if len(descriptions) == 1 else None
        if entity is not self.source:
            selected = ", ".join(str(d.get("name")) for d in descriptions)
            raise ConfigurationError(
                f"eligible of worker {self.name!r} must select {self.source.__name__} "
                f"entities (select({self.source.__name__})...), but it selects {selected}"
            )
        return query

    @property
    def keyed(self) -> bool:
        """Whether its execution rows carry the ``held_key`` of an ``exclusive_by`` limit."""
        return self.table.limits is not None and self.table.limits.keyed

    @property
    def reads_rows(self) -> bool:
        """Whether its claims' source rows may be read with them (``source_rows``): its
        mapping's rows are plain columns, and no read of them failed for good."""
        return not self._rows_stopped and self._source_loader().plain

    def source_rows(self, conn: Connection, keys: Sequence[Any]) -> dict[Any, tuple[Any, ...]]:
        """The source rows of ``keys``, read on ``conn`` as a handler process would read
        them (``Task.row``), by key; none unless ``reads_rows``."""
        if not keys or not self.reads_rows:
            return {}
        return self._source_loader().rows(keys, conn) or {}

    def stop_reading_rows(self) -> None:
        """A read of ``source_rows`` failed other than for a while: its handler
        processes read their rows from now on."""
        self._rows_stopped = True

    def _source_loader(self) -> SourceLoader:
        if self._loader is None:
            self._loader = SourceLoader(self.source, self.table.source_pk)
        return self._loader

    def task(self, claim: Claim, row: tuple[Any, ...] | None = None) -> Task:
        """What an executor needs to run one invocation under ``claim`` (with its
        source row, if read with the claim)."""
        return Task(
            self.name,
            claim.source_id,
            claim.token,
            claim.attempts,
            claim.failures,
            self.handler,
            self.source,
            self.retry,
            self.keyed,
            # A grouped item has no start of its own for a timeout to count from.
            alone=self.timeout is not None
            or not (self.dialect.group_commit or self.dialect.groups_lone_finishes),
            row=row,
        )

    # -- status, for the application -------------------------------------------------

    def state(self, session: Session, source_id: Any) -> ExecutionState | None:
        """The execution record of ``source_id``: ``execution_status``, ``error``,
        ``lease_expires_at`` and more; ``None`` if this worker never claimed it."""
        # The dialect builds the dict with exactly ExecutionState's keys (a test
        # compares them), so the cast only names its type.
        state = self.dialect.read_state(session.connection(), self.table, source_id)
        return cast(ExecutionState | None, state)

    def status(self, session: Session, source_id: Any) -> ExecutionStatus | None:
        phase = self.dialect.read_status(session.connection(), self.table, source_id)
        return None if phase is None else phase.public

    def reset_failed(self, session: Session, source_id: Any) -> bool:
        """Make a FAILED execution UNFINISHED again (error and claim cleared).

        True if it reset one; the change commits with ``session``'s transaction.
        """
        return self.dialect.reset_failed(session.connection(), self.table, source_id)

    def counts(self, session: Session) -> dict[ExecutionStatus | None, int]:
        """How many records are in each status (``None``: discovered, never claimed)."""
        return {
            phase.public: n
            for phase, n in self.dialect.counts(session.connection(), self.table).items()
        }

    def failed(self, session: Session, limit: int | None = None) -> list[FailedItem]:
        """FAILED items: ``source_id``, ``error``, ``error_type``, ``attempts``,
        ``crashes``, ``updated_at``; in key order."""
        return cast(list[FailedItem], self.dialect.failed(session.connection(), self.table, limit))

    def source_id_from_text(self, text: str) -> Any:
        """Parse a source id typed on a command line into the key column's type."""
        try:
            python_type = self.table.source_pk.type.python_type
        except NotImplementedError:
            return text
        try:
            return python_type(text)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"{text!r} is not a valid id for worker {self.name!r} ({python_type.__name__})"
            ) from exc

    def has_status(
        self, source_id: Any, statuses: Iterable[ExecutionStatus]
    ) -> ColumnElement[bool]:
        # A lone status (a str, being a StrEnum) would otherwise iterate as letters.
        if isinstance(statuses, str) or not isinstance(statuses, Iterable):
            raise ConfigurationError(
                "statuses must be a collection of ExecutionStatus members, e.g. "
                f"(ExecutionStatus.FINISHED,), got {statuses!r}"
            )
        wanted = list(statuses)
        for status in wanted:
            if not isinstance(status, ExecutionStatus):
                raise ConfigurationError(
                    f"statuses must be ExecutionStatus members, got {status!r}"
                )
        if not wanted:
            raise ConfigurationError("statuses must name at least one ExecutionStatus")
        self.status_read = True
        return self.dialect.status_condition(self.table, source_id, wanted)


class Worker:
    """A registered worker, as ``coordinator.workers[name]`` returns it: what it is
    (read-only) and its execution records (status, state, failures, reset)."""

    __slots__ = ("_registration",)

    def __init__(self, registration: Registration) -> None:
        self._registration = registration

    @property
    def name(self) -> str:
        return self._registration.name

    @property
    def handler(self) -> Handler:
        return self._registration.handler

    @property
    def source(self) -> type[Any]:
        """The source model whose rows are this worker's work."""
        return self._registration.source

    @property
    def eligible(self) -> Eligible | None:
        return self._registration.eligible

    @property
    def concurrency(self) -> int:
        return self._registration.concurrency

    @property
    def timeout(self) -> float | None:
        return self._registration.timeout

    @property
    def retry(self) -> RetryPolicy | None:
        return self._registration.retry

    @property
    def max_crashes(self) -> int:
        return self._registration.max_crashes

    @property
    def executor(self) -> ExecutorChoice:
        return self._registration.executor

    @property
    def execution_table(self) -> Table:
        """The worker's execution table (in the source model's MetaData, for migrations)."""
        return self._registration.table.table

    def state(self, session: Session, source_id: Any) -> ExecutionState | None:
        """The execution record of ``source_id``: ``execution_status``, ``error``,
        ``lease_expires_at`` and more; ``None`` if this worker never claimed it."""
        return self._registration.state(session, source_id)

    def status(self, session: Session, source_id: Any) -> ExecutionStatus | None:
        """The status of ``source_id``; ``None`` before its first claim."""
        return self._registration.status(session, source_id)

    def reset_failed(self, session: Session, source_id: Any) -> bool:
        """Make a FAILED execution UNFINISHED again (error and claim cleared).

        True if it reset one; the change commits with ``session``'s transaction.
        """
        return self._registration.reset_failed(session, source_id)

    def counts(self, session: Session) -> dict[ExecutionStatus | None, int]:
        """How many records are in each status (``None``: discovered, never claimed)."""
        return self._registration.counts(session)

    def failed(self, session: Session, limit: int | None = None) -> list[FailedItem]:
        """FAILED items: ``source_id``, ``error``, ``error_type``, ``attempts``,
        ``crashes``, ``updated_at``; in key order."""
        return self._registration.failed(session, limit)

    def has_status(
        self, source_id: Any, statuses: Iterable[ExecutionStatus]
    ) -> ColumnElement[bool]:
        """A SQL condition: this worker has one of ``statuses`` for ``source_id``."""
        return self._registration.has_status(source_id, statuses)

    def __repr__(self) -> str:
        return f"<dbworker.Worker {self.name!r} source={self.source.__name__}>"


class RegisteredWorkers(Mapping[str, Worker]):
    """A read-only view of the registered workers whose misses say what is registered."""

    def __init__(self, workers: Mapping[str, Registration]) -> None:
        self._workers = workers

    def __getitem__(self, name: str) -> Worker:
        return Worker(self.registration(name))

    def registration(self, name: str) -> Registration:
        try:
            return self._workers[name]
        except (KeyError, TypeError):
            known = ", ".join(sorted(self._workers)) or "none"
            raise UnknownWorkerError(
                f"no worker named {name!r} is registered (registered: {known})"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._workers)

    def __len__(self) -> int:
        return len(self._workers)

    def __repr__(self) -> str:
        return f"<workers {sorted(self._workers)}>"
