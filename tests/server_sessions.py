"""A database session as its server knows it: who it is, and ending it from outside."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy import text


def server_id(conn: sa.Connection) -> Any:
    """The server's id of ``conn``'s session (PostgreSQL or MySQL)."""
    if conn.dialect.name == "postgresql":
        return conn.execute(text("SELECT pg_backend_pid()")).scalar()
    return conn.execute(text("SELECT CONNECTION_ID()")).scalar()


def drop_on_server(url: str, session_id: Any) -> None:
    """End a session from the server's side, as a restart or an idle timeout would."""
    killer = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with killer.connect() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": session_id})
            else:
                conn.execute(text(f"KILL CONNECTION {int(session_id)}"))
    finally:
        killer.dispose()
