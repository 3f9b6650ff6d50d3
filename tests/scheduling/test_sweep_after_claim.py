"""A woken pass claims before it sweeps, on every database: the sweep (rows committed
out of key order, every few seconds) ran ahead of the claim and held up the rows a
wake-up announced by its transaction; what a sweep adds is claimed in the next pass,
at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from dbworker.core.timing import PollBackoff
from dbworker.scheduling.loop import Scheduler
from dbworker.scheduling.outbox import Outbox
from dbworker.scheduling.state import WorkerState

from .rig import scheduler_of

WORKER = "sweep_order"


class Base(DeclarativeBase):
    pass


class Row(Base):
    __tablename__ = "sweep_order_rows"
    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=False)


class _Slots:
    """An executor with two free slots that keeps the keys it is given."""

    uses_rows = False

    def __init__(self) -> None:
        self.keys: list[Any] = []

    def free_slots(self) -> int:
        return 2

    def submit_all(self, tasks: Any) -> None:
        self.keys.extend(task.source_id for task in tasks)


@pytest.fixture
def scheduled(database_url: str) -> Iterator[tuple[Scheduler, WorkerState, _Slots, sa.Engine]]:
    slots = _Slots()
    backoff = PollBackoff(0.25, 10.0)
    with scheduler_of(database_url, Base, Row, WORKER, slots, backoff) as (scheduler, state, app):
        yield scheduler, state, slots, app


def _transactions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What each of the outbox's transactions is for, from now on."""
    seen: list[str] = []
    transaction = Outbox.transaction

    def named(self: Outbox, what: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(what.split(" for ")[0].split(" of ")[0])
        return transaction(self, what, *args, **kwargs)

    monkeypatch.setattr(Outbox, "transaction", named)
    return seen


def _insert(app: sa.Engine, *ids: int) -> None:
    with app.begin() as conn:
        conn.execute(sa.insert(Row), [{"id": i} for i in ids])


def test_a_pass_claims_before_it_sweeps_and_claims_what_the_sweep_adds(
    scheduled: tuple[Scheduler, WorkerState, _Slots, sa.Engine],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scheduler, state, slots, app = scheduled
    _insert(app, 10)
    now = time.monotonic()
    scheduler.polls.poll(state, now)  # the first: discovery, the claim, then the full sweep
    assert slots.keys == [10]
    # A row committed below the watermark (out of key order): only a sweep finds it.
    _insert(app, 5)
    seen = _transactions(monkeypatch)
    state.discovery.next_sweep = 0.0  # the recent rows' sweep is due
    now = time.monotonic()
    state.poll_now(now)
    scheduler.polls.poll(state, now)
    assert seen == ["discovering and claiming", "sweeping recent rows"], seen
    assert slots.keys == [10]
    # The claim found nothing, but the sweep added a record: the next poll is now.
    assert state.next_poll <= now and not state.discovery.idle
    scheduler.polls.poll(state, now)
    assert slots.keys == [10, 5]
