"""The database clock a dialect reads is the real time, at sub-second resolution.

Leases and delays are measured on it, so a clock that is coarse (a single-precision
cast rounds today's epoch to 128-second steps) or wrong stretches every lease.
The conformance checks use fake clocks, so this is checked on its own.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence

import pytest
from sqlalchemy import ColumnElement, Float, Table, create_engine, func, select, type_coerce
from sqlalchemy.sql.dml import Insert

from dbworker.dialects import Dialect, for_url


def read(dialect: Dialect, url: str) -> list[tuple[float, float, float]]:
    """(python before, database, python after) for a few readings 20 ms apart."""
    engine = create_engine(url, **dialect.coordinator_engine_options())
    dialect.configure_engine(engine)
    readings = []
    try:
        with engine.connect() as conn:
            for _ in range(3):
                before = time.time()
                value = float(conn.execute(select(dialect.now())).scalar_one())
                readings.append((before, value, time.time()))
                time.sleep(0.02)
    finally:
        engine.dispose()
    return readings


def check_clock(dialect: Dialect, url: str) -> None:
    readings = read(dialect, url)
    for before, value, after in readings:
        # Same machine: only the reading's own latency separates the two clocks.
        assert before - 1.0 <= value <= after + 1.0, (before, value, after)
    values = [value for _, value, _ in readings]
    steps = [b - a for a, b in itertools.pairwise(values)]
    assert all(step > 0.005 for step in steps), f"clock does not advance in 20 ms: {values}"


def test_database_clock_is_real_time(database_url: str) -> None:
    check_clock(for_url(database_url), database_url)


class CoarseClock(Dialect):
    """Breaks the clock the way a single-precision cast does: 128-second steps."""

    def __init__(self, inner: Dialect) -> None:
        super().__init__()
        self.inner = inner

    def db_now(self) -> ColumnElement[float]:
        return type_coerce(func.floor(self.inner.db_now() / 128) * 128, Float())

    def insert_ignore(self, table: Table, keys: Sequence[str] = ("source_id",)) -> Insert:
        return self.inner.insert_ignore(table, keys)


@pytest.mark.parametrize("breakage", [CoarseClock])
def test_a_coarse_clock_is_caught(
    database_url: str, breakage: Callable[[Dialect], Dialect]
) -> None:
    broken = breakage(for_url(database_url))
    with pytest.raises(AssertionError):
        check_clock(broken, database_url)
