"""A claim's SET clause comes from the CLAIM and TAKEOVER rows of the transition table:
changing a row changes the SQL, which shows it is derived, not written out again."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import Integer, MetaData, update
from sqlalchemy.dialects import mysql

from dbworker.core.transitions import INCREMENT, NOW, ROWS, Transition
from dbworker.dialects.claim_values import claim_values
from dbworker.schema import execution_table


def set_clause(lease_seconds: float = 30.0) -> list[str]:
    table = execution_table("job", Integer(), MetaData())
    values = claim_values(table, table.c.updated_at, lease_seconds, ("host-1", 42))
    statement = update(table).ordered_values(*values)
    sql = str(statement.compile(dialect=mysql.dialect(), compile_kwargs={"literal_binds": True}))
    assignments = sql.split(" SET ", 1)[1]
    return [part.strip().replace("dbworker_job.", "") for part in assignments.split(", ")]


def test_a_takeover_counts_a_crash_before_the_status_changes() -> None:
    clause = set_clause()
    names = [part.split("=")[0] for part in clause]
    # MySQL assigns left to right: the CASE must read the old status.
    assert names.index("crashes") < names.index("status")
    crashes = clause[names.index("crashes")]
    assert crashes == "crashes=CASE WHEN (status = 'working') THEN crashes + 1 ELSE crashes END"
    assert set(names) == {
        "crashes",
        "status",
        "token",
        "lease_expires_at",
        "not_before",
        "attempts",
        "claimed_at",
        "owner_host",
        "owner_pid",
        "updated_at",
    }
    assert "owner_host='host-1'" in clause and "owner_pid=42" in clause
    assert "lease_expires_at=(updated_at + 30.0)" in clause


def test_the_clause_follows_a_changed_row(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = dict(ROWS)
    takeover = rows[Transition.TAKEOVER]
    # Suppose a takeover also recorded when it happened, in finished_at.
    rows[Transition.TAKEOVER] = replace(takeover, sets={**takeover.sets, "finished_at": NOW})
    rows[Transition.CLAIM] = replace(
        rows[Transition.CLAIM], sets={**rows[Transition.CLAIM].sets, "failures": INCREMENT}
    )
    monkeypatch.setattr("dbworker.dialects.claim_values.ROWS", rows)
    clause = set_clause()
    names = [part.split("=")[0] for part in clause]
    assert clause[names.index("finished_at")] == (
        "finished_at=CASE WHEN (status = 'working') THEN updated_at ELSE finished_at END"
    )
    assert clause[names.index("failures")] == (
        "failures=CASE WHEN (status = 'working') THEN failures ELSE failures + 1 END"
    )
    assert names.index("failures") < names.index("status")
