"""How a coordinator's workers meet the wake-ups (``dbworker.wakeups``): what each
worker's ``eligible`` reads, the channels a table's writes wake, the hook on the
application's session factory, the listener started with the scheduler, and the
PostgreSQL trigger DDL for writes that bypass the session factory."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from sqlalchemy import Engine, Table, create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from .core.errors import ConfigurationError
from .core.names import table_name
from .core.timing import Timings
from .dialects import Dialect
from .logs import logger
from .wakeups import SessionHook, Wakeups, Watched, trigger_ddl, watched
from .wakeups.local import Sender
from .wakeups.targets import by_table
from .worker import Registration

log = logger()


class WakeWiring:
    """One coordinator's wake-ups: announced by the application's commits (when
    ``notifications``), listened for once the scheduler starts."""

    def __init__(
        self,
        session_factory: Callable[[], Session],
        dialect: Dialect,
        url: URL,
        workers: Mapping[str, Registration],
        notifications: bool,
        listen_url: str | URL | None = None,
    ) -> None:
        self.dialect = dialect
        self.url = url
        #: Where the listener connects, when not to ``url`` (which goes through a pooler).
        self.listen_url = None if listen_url is None else self._listen_url(listen_url)
        self.session_factory = session_factory
        #: The coordinator's registrations, as they grow.
        self.workers = workers
        self.notifications = notifications
        self._watch: tuple[tuple[str, ...], dict[Table, frozenset[str]]] | None = None
        self.sender = Sender(dialect.identity(url))
        self.hook = (
            SessionHook(session_factory, self.targets, self.sender) if notifications else None
        )

    def _listen_url(self, given: str | URL) -> URL:
        url = make_url(given)
        if not self.dialect.supports_notify:
            raise ConfigurationError(
                f"listen_url is for LISTEN, which {self.url.get_backend_name()} does not have"
            )
        if url.get_backend_name() != self.url.get_backend_name() or (url.database or "") != (
            self.url.database or ""
        ):
            raise ConfigurationError(
                "listen_url must name the database database_url names, on the server "
                f"itself: {url.render_as_string(hide_password=True)} is not "
                f"{self.url.render_as_string(hide_password=True)}"
            )
        return url

    def watched(self) -> list[Watched]:
        return [
            watched(w.name, w.table.source_pk.table, w.eligible_query)
            for w in list(self.workers.values())
        ]

    def targets(self) -> dict[Table, frozenset[str]]:
        """The channels each table's writes wake, rebuilt when a worker registers (the
        application's flushes ask; usually long after registration is over)."""
        names = tuple(self.workers)
        cached = self._watch
        if cached is None or cached[0] != names:
            cached = self._watch = (names, by_table(self.watched()))
        return cached[1]

    def listener(self, engine: Engine, timings: Timings) -> Wakeups | None:
        """What wakes the scheduler (None with notifications off: polling alone)."""
        if self.hook is not None and not self.hook.installed:
            log.info(
                "coordinator: session_factory is not a sessionmaker, so its commits "
                "cannot announce new work; this coordinator is still woken by others"
            )
        if not self.notifications:
            log.info(
                "coordinator: wake-ups off (notifications=False); new work is found by "
                "polling every %ss to %ss",
                timings.poll_seconds,
                timings.max_poll_seconds,
            )
            return None
        if self.listen_url is not None and self.dialect.supports_notify:
            # Its own engine: the listener detaches the one connection it takes.
            engine = create_engine(self.listen_url, poolclass=NullPool)
        return Wakeups(
            engine,
            self.watched(),
            notify=self.dialect.supports_notify,
            identity=self.dialect.identity(self.url),
            sender=self.sender,
        )

    def trigger_sql(self, worker: Registration) -> list[str]:
        """``Coordinator.notify_trigger_sql``'s DDL for ``worker``."""
        if not self.dialect.supports_notify:
            raise ConfigurationError(
                f"notification triggers need PostgreSQL; {self.url.get_backend_name()} "
                "has no NOTIFY (writes through the session factory still wake workers on "
                "this host, and polling finds the rest)"
            )
        (found,) = [w for w in self.watched() if w.name == worker.name]
        statements: list[str] = []
        own = {table_name(name) for name in self.workers}
        for table in sorted(found.tables, key=lambda t: t.fullname):
            if table.name not in own:  # dbworker's tables: completions announce themselves
                statements += trigger_ddl(table, found.channel)
        # The shared function is created once, before the triggers that call it.
        first = statements[0]
        return [first, *[s for s in statements if s != first]]

    def create_triggers(self, workers: Iterable[str] | None) -> None:
        """``Coordinator.create_notify_triggers``: the triggers of ``workers`` (all)."""
        with self.session_factory() as session:
            conn = session.connection()
            for name in workers or list(self.workers):
                for statement in self.trigger_sql(self.workers[name]):
                    conn.exec_driver_sql(statement)
            session.commit()
