"""What crosses the wire to PostgreSQL: psycopg's protocol trace of chosen connections,
read back as round trips (each the statements it carried, by their first word)."""

from __future__ import annotations

import tempfile
from typing import Any


class WireTrace:
    """Traces every psycopg connection given to ``follow`` until ``round_trips``."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile()  # noqa: SIM115  (closed in round_trips)
        self._followed: list[Any] = []

    def follow(self, dbapi_connection: Any) -> None:
        from psycopg import pq

        pgconn = dbapi_connection.pgconn
        pgconn.trace(self._file.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        self._followed.append(dbapi_connection)

    def round_trips(self) -> list[str]:
        """Each exchange the client waited for (a simple query, or an extended one up to
        its Sync): the first words of the statements it sent, joined by spaces."""
        for connection in self._followed:
            if not connection.closed:
                connection.pgconn.untrace()
        self._file.seek(0)
        text = self._file.read().decode()
        self._file.close()
        trips: list[str] = []
        carried: list[str] = []
        for line in text.splitlines():
            fields = line.split("\t")
            if len(fields) < 3 or fields[0] != "F":
                continue  # the server's messages, or a statement's next lines
            kind, rest = fields[2], fields[3] if len(fields) > 3 else ""
            if kind in ("Query", "Parse"):
                # Query "sql" ; Parse "name" "sql" ...
                quoted = rest.strip().split('"')
                carried.append(quoted[1 if kind == "Query" else 3].split()[0].upper())
            if kind in ("Query", "Sync"):
                trips.append(" ".join(carried))
                carried = []
        return trips
