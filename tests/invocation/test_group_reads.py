"""A group reads its items' rows in one statement as it begins (``group._read_rows``):
an item whose handler sends nothing costs no statement of its own (no SAVEPOINT, no
SELECT); an item sees what the items before it in the group wrote to its row (read
again once one sent statements), and the worker's groups read by item from then on."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event, update
from sqlalchemy.orm import Session

from dbworker import Finished, Outcome
from dbworker.core.tasks import ResultKind
from dbworker.invocation.session import HandlerSession

from .test_group import WORKER, GroupItem, Rig, rig, run_all  # noqa: F401  (the fixture)

#: (item id, the mode its handler saw).
SEEN: list[tuple[int, str]] = []


def handle(source: GroupItem, session: Session) -> Outcome:
    SEEN.append((source.id, source.mode))
    if source.mode == "write-next":
        session.execute(
            update(GroupItem).where(GroupItem.id == source.id + 1).values(mode="written")
        )
    return Finished()


@contextmanager
def statements(setup: Rig) -> Iterator[list[str]]:
    """The statements the handler process's engine sends meanwhile."""
    sent: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(" ".join(statement.split()).upper())

    engine = setup.runtime.engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", record)


def _run(setup: Rig) -> list[ResultKind]:
    setup.tasks = [dataclasses.replace(task, handler=handle) for task in setup.tasks]
    SEEN.clear()
    return [result.kind for result in run_all(setup)]


def _reads(sent: list[str]) -> int:
    return sum(s.startswith("SELECT") and "GROUP_ITEMS" in s for s in sent)


def test_a_group_of_quiet_handlers_reads_once_and_sends_no_savepoint(rig: Any) -> None:  # noqa: F811
    setup = rig(["nothing"] * 5)
    with statements(setup) as sent:
        assert _run(setup) == [ResultKind.FINISHED] * 5
    assert _reads(sent) == 1, sent
    assert not [s for s in sent if s.startswith("SAVEPOINT")], sent
    assert [mode for _, mode in SEEN] == ["nothing"] * 5
    assert setup.finished_count() == 5


def test_an_item_sees_what_an_item_before_it_wrote_to_its_row(rig: Any) -> None:  # noqa: F811
    setup = rig(["write-next", "nothing", "nothing"])
    assert _run(setup) == [ResultKind.FINISHED] * 3
    assert SEEN == [(1, "write-next"), (2, "written"), (3, "nothing")]
    assert WORKER in setup.runtime.writing
    assert setup.finished_count() == 3


def test_a_worker_whose_handlers_write_is_read_by_item_from_then_on(rig: Any) -> None:  # noqa: F811
    setup = rig(["nothing"] * 4)
    setup.runtime.writing.add(WORKER)
    with statements(setup) as sent:
        assert _run(setup) == [ResultKind.FINISHED] * 4
    assert _reads(sent) == 4, sent
    assert setup.finished_count() == 4


def session_commits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The handler sessions' commits from now on (the source id each was for)."""
    committed: list[int] = []
    original = HandlerSession.commit

    def commit(self: HandlerSession) -> None:
        committed.append(min(item.id for item in self.identity_map.values()))  # type: ignore[attr-defined]
        original(self)

    monkeypatch.setattr(HandlerSession, "commit", commit)
    return committed


def test_a_quiet_items_session_is_not_committed(
    rig: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # It began no savepoint: its commit would be the ORM's bookkeeping alone.
    setup = rig(["nothing", "nothing", "write-next"])
    committed = session_commits(monkeypatch)
    assert _run(setup) == [ResultKind.FINISHED] * 3
    assert committed == [3], "only the item that sent a statement"
    assert setup.finished_count() == 3


def test_a_listened_for_session_end_keeps_every_commit(
    rig: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup = rig(["nothing"] * 3)
    ended: list[int] = []

    def after_commit(session: Session) -> None:
        ended.append(len(session.identity_map))

    committed = session_commits(monkeypatch)
    event.listen(HandlerSession, "after_commit", after_commit)
    try:
        assert _run(setup) == [ResultKind.FINISHED] * 3
    finally:
        event.remove(HandlerSession, "after_commit", after_commit)
    assert committed == [1, 2, 3]
    assert ended == [1, 1, 1], "each item's session ended as a commit, as before"
