"""On SQLite, a handler holds the database's one write lock only from its own first
statement: dbworker reads the source row in a read transaction of its own first."""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy.engine import make_url

from dbworker import ExecutionStatus

from . import app
from .support import Rig, make_choice


@pytest.mark.backends("sqlite")
def test_a_handler_that_has_not_written_blocks_no_writer(rig: Rig) -> None:
    coordinator = rig.coordinator(make_choice("pool"), handler=app.handle_without_rollback)
    coordinator.start()
    [item] = rig.add("gate")
    rig.wait_run(item, 1)  # the handler runs, its source row loaded, no statement of its own
    path = make_url(rig.url).database
    assert path
    # Another writer gets the write lock at once (it would wait out its busy timeout, then
    # fail, if the handler's transaction had begun with the read of its row).
    other = sqlite3.connect(path, timeout=0.5, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    finally:
        other.close()
    rig.open_gate(item, 1)
    rig.wait_status(coordinator, [item], ExecutionStatus.FINISHED)
