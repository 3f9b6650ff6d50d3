"""MySQL 8 / MariaDB 10.6+: lock execution rows by primary key, after an unlocked search."""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import ColumnElement, Connection, Float, Select, Table, func, literal_column
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.sql.dml import Insert

from .base import Claim, Dialect, WorkerTable

# 1205 lock wait timeout, 1213 deadlock, 1927 connection killed (MariaDB),
# 2002/2003 cannot connect, 2006 server gone away, 2013 lost connection, 4031 idle disconnect.
_TRANSIENT_CODES = frozenset({1205, 1213, 1927, 2002, 2003, 2006, 2013, 4031})


class MySQLDialect(Dialect):
    backend_names: ClassVar[tuple[str, ...]] = ("mysql", "mariadb")
    supports_skip_locked: ClassVar[bool] = True
    #: How many unlocked-search rounds a claim makes before settling for fewer rows.
    search_rounds: ClassVar[int] = 4

    def db_now(self) -> ColumnElement[float]:
        # UTC_TIMESTAMP is independent of the session time zone, and TIMESTAMPDIFF
        # on DATETIMEs does no zone conversion (UNIX_TIMESTAMP(NOW()) would, and is
        # ambiguous in a DST fall-back hour).
        return (
            func.timestampdiff(
                literal_column("MICROSECOND"),
                literal_column("'1970-01-01 00:00:00'"),
                func.utc_timestamp(6),
            )
            / 1e6
        ).cast(Float())

    def coordinator_engine_options(self) -> dict[str, Any]:
        # Claims read the latest committed rows; REPEATABLE READ's snapshot would
        # keep showing a record as claimable after another coordinator took it.
        return {**super().coordinator_engine_options(), "isolation_level": "READ COMMITTED"}

    def insert_ignore(self, table: Table) -> Insert:
        # ON DUPLICATE KEY (not INSERT IGNORE), which would also swallow data errors.
        statement = mysql_insert(table)
        return statement.on_duplicate_key_update(source_id=statement.inserted.source_id)

    def lock_candidates(
        self, conn: Connection, worker: WorkerTable, eligible: Select[Any], limit: int
    ) -> list[Claim]:
        # MariaDB locks the application's rows too when a locking SELECT joins them,
        # and a locking semi-join that sorts through a temporary table has returned no
        # rows to a second claimer while unlocked work remained. So: search without
        # locks, then lock only execution rows by primary key, re-checking that each
        # is still claimable, and search further past rows another claimer holds.
        table = worker.table
        claims: list[Claim] = []
        seen: list[Any] = []
        for _ in range(self.search_rounds):
            wanted = limit - len(claims)
            window = 2 * wanted + 8
            query = self.candidates(worker, eligible, window, self.now())
            if seen:
                query = query.where(table.c.source_id.not_in(seen))
            found = [row[0] for row in conn.execute(query).all()]
            if not found:
                break
            # Lock no more rows than are still wanted, walking ``found`` in the
            # eligible order: a row locked but not claimed stays locked until commit,
            # so over-locking would hand a concurrent claimer nothing.
            position = 0
            while position < len(found) and len(claims) < limit:
                chunk = found[position : position + limit - len(claims)]
                position += len(chunk)
                rows: list[Any] = list(
                    conn.execute(
                        Select(
                            table.c.source_id,
                            table.c.token,
                            table.c.attempts,
                            table.c.failures,
                            table.c.crashes,
                        )
                        .where(table.c.source_id.in_(chunk), self.claimable(table, self.now()))
                        .with_for_update(skip_locked=True)
                    ).all()
                )
                locked = {row[0]: Claim(*row) for row in rows}
                claims.extend(locked[i] for i in chunk if i in locked)
            if len(claims) >= limit or len(found) < window:
                break
            seen.extend(found)
        return claims

    def is_transient(self, error: BaseException) -> bool:
        orig = getattr(error, "orig", None)
        code = orig.args[0] if orig is not None and getattr(orig, "args", None) else None
        return code in _TRANSIENT_CODES or super().is_transient(error)
