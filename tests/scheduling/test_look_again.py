"""After a result, which workers look for work again at once: every other worker (its
eligible query may read the item's status, or rows the handler wrote), and the item's
own worker unless the item ended for good, held no limit and no query reads its
status; then it looks again no later than its busy poll would."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from dbworker import Coordinator, ExecutionStatus
from dbworker.core.tasks import Result, ResultKind
from dbworker.core.timing import PollBackoff
from dbworker.scheduling.outcomes import Outcomes
from dbworker.scheduling.state import WorkerState

POLL_SECONDS = 0.25
NOW = 1000.0
#: When each worker last polled; its next poll was far off (it had backed off).
POLLED_AT = NOW - 0.1
FAR_OFF = NOW + 60


def _state(name: str, limits: Any = None, status_read: bool = False) -> WorkerState:
    worker: Any = SimpleNamespace(
        name=name,
        table=SimpleNamespace(limits=limits),
        status_read=status_read,
        max_crashes=3,
    )
    backoff = PollBackoff(POLL_SECONDS, 10.0)
    state = WorkerState(worker, SimpleNamespace(), backoff)  # type: ignore[arg-type]
    for _ in range(5):
        backoff.next_wait()  # backed off: the next empty poll would wait long
    state.polled_at, state.next_poll = POLLED_AT, FAR_OFF
    return state


class _Endings:
    def result(self, *_: Any, **__: Any) -> None:
        pass


def _after(kind: ResultKind, own: WorkerState) -> tuple[WorkerState, WorkerState]:
    """``own`` and another worker's state after a result of ``kind`` for ``own``."""
    other = _state("other")
    outcomes: Any = Outcomes.__new__(Outcomes)
    outcomes.states = {"own": own, "other": other}
    outcomes.health = SimpleNamespace(completed=0)
    outcomes.endings = _Endings()
    result = Result(("own", 7, 1), kind)
    outcomes.handle(own, result)
    return own, other


@pytest.fixture(autouse=True)
def _clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dbworker.scheduling.outcomes.time.monotonic", lambda: NOW)


@pytest.mark.parametrize("kind", [ResultKind.FINISHED, ResultKind.FAILED])
def test_an_item_ended_for_good_leaves_its_worker_to_its_busy_poll(kind: ResultKind) -> None:
    own, other = _after(kind, _state("own"))
    assert own.next_poll == pytest.approx(POLLED_AT + POLL_SECONDS)
    assert other.next_poll == NOW
    for state in (own, other):
        assert state.backoff.next_wait() == POLL_SECONDS  # reset


@pytest.mark.parametrize(
    "kind",
    [
        ResultKind.UNFINISHED,
        ResultKind.RETRYING,
        ResultKind.LOST,
        ResultKind.UNRECORDED,
        ResultKind.CRASHED,
    ],
)
def test_an_item_that_may_be_claimed_again_has_its_worker_look_at_once(
    kind: ResultKind,
) -> None:
    own, other = _after(kind, _state("own"))
    assert own.next_poll == NOW and other.next_poll == NOW


def test_a_finish_that_frees_a_limit_has_its_worker_look_at_once() -> None:
    own, _ = _after(ResultKind.FINISHED, _state("own", limits=object()))
    assert own.next_poll == NOW


def test_a_finish_whose_status_a_query_reads_has_its_worker_look_at_once() -> None:
    own, _ = _after(ResultKind.FINISHED, _state("own", status_read=True))
    assert own.next_poll == NOW


def test_a_poll_due_sooner_stays_as_it_was() -> None:
    own = _state("own")
    own.next_poll = NOW - 1
    _after(ResultKind.FINISHED, own)
    assert own.next_poll == NOW - 1


class _Base(DeclarativeBase):
    pass


class _Row(_Base):
    __tablename__ = "look_again_rows"
    id: Mapped[int] = mapped_column(primary_key=True)


def _handler(source: Any, session: Any) -> Any:
    raise AssertionError("not run")


def test_a_status_condition_marks_the_worker_whose_status_it_reads(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'look_again.db'}"
    coordinator = Coordinator(sessionmaker(sa.create_engine(url)), database_url=url)
    for name in ("first", "then"):
        coordinator.transactional_worker(name=name, source=_Row)(_handler)
    coordinator.has_execution_status(
        worker="first", source_id=_Row.id, statuses=(ExecutionStatus.FINISHED,)
    )
    assert coordinator._registration("first").status_read
    assert not coordinator._registration("then").status_read
    coordinator.workers["then"].has_status(_Row.id, (ExecutionStatus.FINISHED,))
    assert coordinator._registration("then").status_read
