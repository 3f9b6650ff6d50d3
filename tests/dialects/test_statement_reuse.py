"""On the database's own clock, fenced transitions reuse statements built once.

A handler process completes its item without building SQL: the dialect keeps each
fenced UPDATE (finish, unfinish, fail, renew) per table and shape and binds only
the item, the token and the values. The conformance checks run on a fake clock,
which turns that reuse off, so here the production path is driven directly: calls
in a row with different items, tokens, delays and errors must each leave their own
values, never those of the call that built the statement.
"""

from __future__ import annotations

from typing import Any

from dbworker.dialects import ErrorInfo, for_url
from dbworker.testing import Harness

#: Database clock readings inside one transaction differ by the statements' latency.
TOLERANCE_SECONDS = 5.0


def test_each_reused_statement_applies_its_own_values(database_url: str) -> None:
    with Harness(lambda _clock: for_url(database_url), database_url) as h:
        h.seed()
        h.discover(h.items)
        worker = h.items
        tokens = {i: h.claim_one(worker, i).token for i in range(1, 13)}
        with h.transaction() as conn:
            d = h.dialect
            assert d.unfinish(conn, worker, 1, tokens[1], 100.0)
            assert d.unfinish(conn, worker, 2, tokens[2], 1000.0)
            assert d.fail(conn, worker, 3, tokens[3], ErrorInfo("first", "E1", "t1"), 10.0)
            assert d.fail(conn, worker, 4, tokens[4], ErrorInfo("second", "E2", "t2"), 20.0)
            assert d.fail(conn, worker, 5, tokens[5], ErrorInfo("third", "E3", "t3"))
            assert d.fail(conn, worker, 6, tokens[6], ErrorInfo("fourth", None, None))
            assert d.finish(conn, worker, 7, tokens[7])
            # The statement finish 7 built must fence item 8 by item 8's token.
            assert not d.finish(conn, worker, 8, tokens[8] + 1)
            assert not d.finish(conn, worker, 8, tokens[8] - 1)
            assert d.finish(conn, worker, 8, tokens[8])
            assert d.renew(conn, worker, [(9, tokens[9])], 60.0) == []
            assert d.renew(conn, worker, [(10, tokens[10])], 600.0) == []
            assert d.renew(conn, worker, [(9, tokens[9] - 1), (10, tokens[10])], 600.0) == [9]
            # The status a release writes is a constant in its statement: the one
            # built for "claimable again" must not serve "give up".
            error = ErrorInfo("crashed", "dbworker.WorkerCrashed", None)
            assert d.release(conn, worker, 11, tokens[11], error, gives_up=False)
            assert d.release(conn, worker, 12, tokens[12], error, gives_up=True)
        rows: dict[Any, dict[str, Any]] = h.records(worker)

    def close(actual: float, expected: float) -> bool:
        return abs(actual - expected) < TOLERANCE_SECONDS

    first, second = rows[1], rows[2]
    assert (first["status"], second["status"]) == ("unfinished", "unfinished")
    assert close(second["not_before"] - first["not_before"], 900.0)
    assert close(first["not_before"] - first["updated_at"], 100.0)

    retried, retried_again = rows[3], rows[4]
    assert (retried["status"], retried["failures"], retried["error"]) == ("unfinished", 1, "first")
    assert (retried["error_type"], retried["traceback"]) == ("E1", "t1")
    assert (retried_again["error"], retried_again["error_type"]) == ("second", "E2")
    assert retried_again["failures"] == 1
    assert close(retried_again["not_before"] - retried["not_before"], 10.0)

    failed, failed_bare = rows[5], rows[6]
    assert (failed["status"], failed["failures"], failed["error"]) == ("failed", 0, "third")
    assert failed["finished_at"] is not None and failed["not_before"] is None
    assert (failed_bare["error"], failed_bare["error_type"], failed_bare["traceback"]) == (
        "fourth",
        None,
        None,
    )

    for item in (7, 8):
        assert rows[item]["status"] == "finished"
        assert rows[item]["error"] is None and rows[item]["finished_at"] is not None
        assert rows[item]["token"] == tokens[item]

    assert close(rows[10]["lease_expires_at"] - rows[9]["lease_expires_at"], 540.0)
    assert (rows[11]["status"], rows[12]["status"]) == ("unfinished", "failed")
    assert rows[11]["crashes"] == rows[12]["crashes"] == 1
