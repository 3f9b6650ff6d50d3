"""The machine's model, its clients (actors and application writers, each on its own
connection) and the plumbing of their transactions; the rules build on ``MachineBase``."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple, TypeVar

from hypothesis import event as note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine
from sqlalchemy import Connection, RootTransaction
from sqlalchemy.exc import DBAPIError

from ...core.transitions import Record
from ...dialects import Owner
from .harness import ACTORS, WRITERS, ModelMismatch, StatefulHarness

T = TypeVar("T")


@dataclass(eq=False)
class Client:
    """One connection: an actor (a coordinator process) or an application writer."""

    name: str
    conn: Connection | None = None
    tx: RootTransaction | None = None


@dataclass(eq=False)
class Actor(Client):
    #: Claims this actor committed and believes it still holds: source id -> token.
    held: dict[int, int] = field(default_factory=dict)
    #: The claim in progress (transaction open): source id -> (record before, after).
    pending: dict[int, tuple[Record, Record]] = field(default_factory=dict)
    #: The same for the keyed worker's records (``KeyedRules``).
    keyed_held: dict[int, int] = field(default_factory=dict)
    keyed_pending: dict[int, tuple[Record, Record]] = field(default_factory=dict)
    #: The connection it claims on as a scheduler does (``claim_as_scheduler``).
    scheduler: Connection | None = None


class Belief(NamedTuple):
    """An actor's belief that it holds ``token`` for record ``sid``."""

    actor: Actor
    sid: int
    token: int


@dataclass(eq=False)
class Writer(Client):
    #: Rows inserted in the open transaction: id -> eligible.
    pending: dict[int, bool] = field(default_factory=dict)


actor_index = st.integers(0, ACTORS - 1)
writer_index = st.integers(0, WRITERS - 1)
any_pick = st.integers(0, 10**6)
delays = st.integers(0, 15)
retries = st.none() | delays
#: Eligible three times in four: ineligible rows matter, but claims need work.
flags = st.sampled_from([True, True, True, False])


def choose(choices: Sequence[T], index: int) -> T:
    return choices[index % len(choices)]


def describe(records: dict[int, Record]) -> str:
    return "\n".join(f"  {sid}: {rec}" for sid, rec in sorted(records.items())) or "  (none)"


class MachineBase(RuleBasedStateMachine):
    """The model, the clients and their transactions, and how a fenced event is judged:
    what every group of rules builds on."""

    harness: ClassVar[StatefulHarness]

    def __init__(self) -> None:
        super().__init__()
        self.h = self.harness
        self.h.reset()
        self.clock = self.h.clock
        self.dialect = self.h.dialect
        self.owner = Owner("stateful", 0)
        #: The model: committed execution records, committed source rows, effects.
        self.records: dict[int, Record] = {}
        #: The keyed worker's committed records (``KeyedRules``).
        self.keyed_records: dict[int, Record] = {}
        self.items: dict[int, bool] = {}
        self.effects: list[tuple[int, int, str]] = []
        #: The (worker, slot) of every tick made (``TickRules``).
        self.made_ticks: set[tuple[str, int]] = set()
        self.actors = [Actor(f"actor{i}") for i in range(ACTORS)]
        self.writers = [Writer(f"writer{i}") for i in range(WRITERS)]

    def teardown(self) -> None:
        for client in [*self.actors, *self.writers]:
            if client.conn is not None:
                client.conn.close()  # rolls back whatever is still open
                client.conn = client.tx = None
        for actor in self.actors:
            if actor.scheduler is not None:
                # As the scheduler lets it go: the pool's next user gets none of it.
                self.dialect.release_scheduler_connection(actor.scheduler)
                actor.scheduler.close()
                actor.scheduler = None

    # -- transaction plumbing ------------------------------------------------------

    def _clients(self) -> list[Client]:
        return [*self.actors, *self.writers]

    def _can_begin(self) -> bool:
        """SQLite has one writer: nothing may begin while any transaction is open."""
        return self.h.concurrent or all(c.tx is None for c in self._clients())

    def _idle_actors(self) -> list[Actor]:
        return [a for a in self.actors if a.tx is None]

    def _idle_writers(self) -> list[Writer]:
        return [w for w in self.writers if w.tx is None]

    def _begin(self, client: Client) -> Connection:
        if client.conn is None:
            client.conn = self.h.engine.connect()
        client.tx = client.conn.begin()
        return client.conn

    def _commit(self, client: Client) -> None:
        assert client.tx is not None
        client.tx.commit()
        client.tx = None

    def _rollback(self, client: Client) -> None:
        if client.tx is not None:
            client.tx.rollback()
            client.tx = None

    def _crash(self, client: Client) -> None:
        """The process dies mid-transaction: the connection drops, nothing commits."""
        assert client.conn is not None
        session = self.h.session_id(client.conn)
        client.conn.invalidate()
        client.conn.close()
        client.conn = client.tx = None
        self.h.wait_session_gone(session)
        if isinstance(client, Actor):
            if client.scheduler is not None:  # the same process's: gone with it
                client.scheduler.invalidate()
                client.scheduler.close()
                client.scheduler = None
            client.held.clear()
            client.pending.clear()
            client.keyed_held.clear()
            client.keyed_pending.clear()

    def _locked_by_others(self, client: Client) -> set[int]:
        return {sid for a in self.actors if a is not client for sid in a.pending}

    def _run(self, client: Client, work: Callable[[Connection], T]) -> T:
        """Run ``work`` in a new transaction of ``client`` (left open for the caller).

        Steps never touch rows an open claim holds (``_beliefs``), so any lock wait
        means the implementation locked more than the model allows: a claim waiting
        for another claim, or dbworker holding the application's rows.
        """
        conn = self._begin(client)
        try:
            return work(conn)
        except DBAPIError as exc:
            self._rollback(client)
            self._fail_on_lock_wait(client, exc)
            raise

    def _alone(self, client: Client, work: Callable[[Connection], T]) -> T:
        """Run ``work`` on ``client``'s connection in no transaction: it commits its own,
        and must leave none open."""
        if client.conn is None:
            client.conn = self.h.engine.connect()
        conn = client.conn
        try:
            result = work(conn)
        except DBAPIError as exc:
            conn.rollback()
            self._fail_on_lock_wait(client, exc)
            raise
        if conn.in_transaction():
            conn.rollback()
            raise ModelMismatch(f"{client.name}: a statement alone left a transaction open")
        return result

    def _fail_on_lock_wait(self, client: Client, exc: DBAPIError) -> None:
        """A step of ``client`` that waited for a lock (``exc``) is a model mismatch."""
        if self.h.is_lock_wait(exc):
            raise ModelMismatch(
                f"{client.name} waited for a lock (open claims hold"
                f" {sorted(self._locked_by_others(client))}): {exc.orig}"
            ) from exc

    def _claimable(self, exclude: Collection[int] = ()) -> list[int]:
        """What a claim must return, in the eligible query's order (by id)."""
        now = self.clock.now
        return [
            sid
            for sid, record in sorted(self.records.items())
            if self.items.get(sid, False)
            and record.claimable(now) is not None
            and sid not in exclude
        ]

    # -- the holder's fenced events -------------------------------------------------

    def _beliefs(self) -> list[Belief]:
        """The claims idle actors believe they hold, except on rows another open claim
        has locked: that event would wait for the claim to end, and one thread cannot
        wait (the real caller waits, or fails with a lock timeout and retries)."""
        return [
            Belief(actor, sid, token)
            for actor in self._idle_actors()
            for sid, token in sorted(actor.held.items())
            if sid not in self._locked_by_others(actor)
        ]

    def _stale_beliefs(self) -> list[Belief]:
        return [b for b in self._beliefs() if b.token != self.records[b.sid].token]

    def _can_act_on_claims(self) -> bool:
        return self._can_begin() and bool(self._beliefs())

    def _judge_fenced(
        self, belief: Belief, event: str, applied: bool, after: Record | None
    ) -> None:
        actor, sid, token = belief
        current = self.records[sid]
        note(
            f"{event}: {'applied' if after else 'refused'}"
            + ("" if token == current.token else " (stale token)")
        )
        if applied != (after is not None):
            raise ModelMismatch(
                f"{actor.name}: {event}({sid}, token={token}) at {self.clock.now}"
                f" {'applied' if applied else 'was refused'}, but the model"
                f" {'refuses' if after is None else 'allows'} it; record is {current}"
            )

    def _settle(self, belief: Belief, event: str, applied: bool, after: Record | None) -> None:
        self._judge_fenced(belief, event, applied, after)
        if applied:
            self._commit(belief.actor)
            assert after is not None
            self.records[belief.sid] = after
        else:
            self._rollback(belief.actor)
        del belief.actor.held[belief.sid]
