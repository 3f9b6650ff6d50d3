"""The core transition model against a dialect's SQL, as a Hypothesis state machine.

``dbworker.core.transitions`` (``Record`` + ``claim``/``renew``/``finish``/...) is the
model; a ``Dialect`` running SQL on a real database is the implementation. Several
actors (coordinators), each on its own connection, and a few application writers act in
one thread, in orders Hypothesis chooses, against a fake clock. Every step computes what
the model says must happen, makes the database do it, and compares; after every step the
whole committed state (execution rows, handler effects, what the dialect's guard calls
claimable) must equal the model.

Concurrency without threads: a claim can be left with its transaction open ("a claim in
progress"), and an application insert too, while other actors go on. A step that would
have to wait for one of those transactions could never finish in one thread, so steps
do not touch rows a claim in progress holds (a real caller would wait, or time out and
retry), and connections fail a lock wait quickly instead of hanging. Any wait that
still happens is a finding: a claim waiting for another claim (what SKIP LOCKED is
for), an application write waiting for dbworker, or a claim holding locks on rows it
did not claim. SQLite has one writer at a time (``supports_concurrent_claims`` is
False), so there preconditions keep a second transaction from opening while one is.

Invariants, numbered as in docs/internals.md, and where this machine checks each:

1. Exclusive: the database's token for every record equals the model's, and at most
   one actor believes it holds the current token (``check_committed_state``); a fenced
   event with any other token fails and changes nothing (every fenced rule).
2. Atomic: the handler's effect row exists iff its same-token transition committed
   (effects are compared after every step; completions write the effect first and
   sometimes crash before committing).
3. Terminal: the dialect's claim guard matches the model's on every row after every
   step, and every claim returns exactly the records the model says are claimable.
4. Recovery: expired WORKING records are in the model's claimable set, so a claim by
   any actor must take them over.
5. No loss: discovery and sweeps must add exactly the rows the model expects (rows
   committed out of key order land below the watermark and only a sweep finds them);
   ``drain`` lets time pass, sweeps and claims everything, and checks that every
   committed eligible non-terminal row was claimed.
6. Bounded crash loops: not here as such (that takes real processes: tests/crash,
   tests/executors); the crash counters a takeover and a release store, and release's
   FAILED at ``MAX_CRASHES``, are compared with the model like every other field.
7. Renewal is fenced too: a renewal reports exactly the claims the model says were
   lost and leaves the other rows untouched.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, NamedTuple, TypeVar

from hypothesis import event as note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    CompoundSelect,
    Connection,
    Engine,
    Float,
    Integer,
    MetaData,
    RootTransaction,
    Select,
    String,
    Table,
    bindparam,
    case,
    create_engine,
    delete,
    event,
    insert,
    literal_column,
    null,
    select,
    union_all,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from dbworker.core import policy, transitions
from dbworker.core.errors import InvalidTransition
from dbworker.core.policy import Ending, decide
from dbworker.core.status import TERMINAL, Phase
from dbworker.core.transitions import Record
from dbworker.dialects import Dialect, ErrorInfo, Owner, WorkerTable, dialect_class
from dbworker.schema import execution_table

T = TypeVar("T")

# Whole seconds only: a database may add a bound float as a DECIMAL literal (exact,
# rounded once) where Python rounds each addition; with integral values both are exact,
# so the model and the database can be compared with ==.
START: Final = 1_000_000.0
LEASE: Final = 10.0
MAX_ID: Final = 9  # few keys, so inserts collide with discovery and come out of order
ACTORS: Final = 3
WRITERS: Final = 2
MAX_CRASHES: Final = 3
MAX_CLAIM: Final = 4
ERROR: Final = ErrorInfo("handler raised", "RuntimeError")
CRASH: Final = ErrorInfo("handler process died", "dbworker.WorkerCrashed")

#: How long a crashed connection's server session may take to go away.
SESSION_GONE_DEADLINE_SECONDS: Final = 30.0


class ModelMismatch(AssertionError):
    """The database did something the core model does not allow (or failed to do
    something it requires). Every check of this suite raises this, so a test can tell
    a caught bug from an accident in the harness."""


class FakeClock:
    """The injected database clock; only rules move it, and only forward."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


# -- schema ----------------------------------------------------------------------------

metadata = MetaData()
items = Table(
    "sm_item",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("eligible", Boolean, nullable=False),
)
#: What handlers write, in the same transaction as finish/unfinish. Surrogate key: the
#: same (source_id, token) may legitimately be attempted again after a rollback.
effects = Table(
    "sm_effect",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("source_id", Integer, nullable=False),
    Column("token", BigInteger, nullable=False),
    Column("kind", String(16), nullable=False),
)
executions = execution_table("sm", Integer(), metadata)
WORKER: Final = WorkerTable("sm", executions, items.c.id, monotonic_keys=True)


def eligible() -> Select[Any]:
    return select(items).where(items.c.eligible.is_(True)).order_by(items.c.id)


# -- harness: engines, created once per test -------------------------------------------


@dataclass
class Harness:
    backend: str
    dialect: Dialect
    clock: FakeClock
    #: Actors and application writers; configured the way the coordinator configures its own.
    engine: Engine
    #: Autocommit reads of committed state, and the per-example reset.
    reader: Connection
    #: Execution rows (tagged 0, or 1 where the dialect's claim guard admits them) and
    #: effect rows (tagged 2) in one round trip; built once, since constructing SQL
    #: costs more than running it on tables this small.
    state_query: CompoundSelect[Any] = field(init=False)

    def __post_init__(self) -> None:
        t = executions
        now = bindparam("now", type_=Float())
        self.state_query = union_all(
            select(
                case((self.dialect.claimable(t, now), 1), else_=0),
                t.c.source_id,
                t.c.status,
                t.c.token,
                t.c.lease_expires_at,
                t.c.not_before,
                t.c.attempts,
                t.c.failures,
                t.c.crashes,
                t.c.error,
            ),
            select(
                literal_column("2"),
                effects.c.source_id,
                effects.c.kind,
                effects.c.token,
                *[null()] * 6,
            ),
        )

    @property
    def concurrent(self) -> bool:
        return self.dialect.supports_concurrent_claims

    def reset(self) -> None:
        # DELETE, not DDL: a fresh schema per example would cost more than the example.
        for table in (effects, executions, items):
            self.reader.execute(delete(table))
        self.clock.now = START

    def session_id(self, conn: Connection) -> int | None:
        if self.backend == "postgresql":
            return int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
        if self.backend == "mysql":
            return int(conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar_one())
        return None  # SQLite: closing the connection releases its lock synchronously

    def wait_session_gone(self, session_id: int | None) -> None:
        """Wait until the server has rolled back a dropped connection's transaction, so
        the next step does not see its locks as if they were still held on purpose."""
        if session_id is None:
            return
        if self.backend == "postgresql":
            query = f"SELECT count(*) FROM pg_stat_activity WHERE pid = {session_id:d}"
        else:
            # A MariaDB session leaves the process list only after rolling back. (Not
            # information_schema.innodb_trx: it is a cache that polling keeps stale.)
            query = f"SELECT count(*) FROM information_schema.processlist WHERE id = {session_id:d}"
        deadline = time.monotonic() + SESSION_GONE_DEADLINE_SECONDS
        while self.reader.exec_driver_sql(query).scalar_one():
            if time.monotonic() > deadline:
                raise RuntimeError(f"server session {session_id} outlived its connection")
            time.sleep(0.001)

    def is_lock_wait(self, error: DBAPIError) -> bool:
        orig = error.orig
        if self.backend == "postgresql":
            return getattr(orig, "sqlstate", None) == "55P03"  # lock_not_available
        if self.backend == "mysql":
            return bool(orig is not None and orig.args and orig.args[0] == 1205)
        return "locked" in str(orig).lower()


def _fail_lock_waits_at_once(engine: Engine, backend: str) -> None:
    """In one thread a lock wait on another open transaction of the same test never ends.
    Make it a quick error that the machine can judge."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            if backend == "postgresql":
                # 0 would mean "wait forever"; any wait here is on a lock that cannot
                # be released while this thread waits, so the length does not matter.
                cursor.execute("SET lock_timeout = '10ms'")
                # Commits stay atomic and visible at once; only durability across a
                # server crash is traded for not waiting for a WAL flush per step.
                cursor.execute("SET synchronous_commit = off")
            elif backend == "mysql":
                # The minimum: 0 would be "no wait", but MariaDB 10.11 then fails every
                # SKIP LOCKED read that meets a locked row (error 1180), which is not
                # how dbworker runs. Only findings wait, so the second is rarely spent.
                cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
            else:
                # Replaces the dialect's busy timeout: a second writer is a bug in
                # the preconditions and should fail, not hang for 30 s.
                cursor.execute("PRAGMA busy_timeout = 0")
                # WAL stays on; NORMAL skips an fsync per commit (still crash-safe in
                # WAL mode), which is most of SQLite's cost per step.
                cursor.execute("PRAGMA synchronous = NORMAL")
        finally:
            cursor.close()
        if backend != "sqlite":
            # psycopg runs the SET in an implicit transaction; a rollback at pool
            # check-in would undo it.
            dbapi_connection.commit()


@contextlib.contextmanager
def open_harness(url: str, dialect_cls: type[Dialect] | None = None) -> Iterator[Harness]:
    """Engines and tables for one test; the machine empties the tables per example."""
    parsed = make_url(url)
    backend_name = parsed.get_backend_name()
    backend = "mysql" if backend_name in ("mysql", "mariadb") else backend_name
    clock = FakeClock()
    dialect = (dialect_cls or dialect_class(backend_name))(clock)
    dialect.validate_url(parsed)
    engine = create_engine(url, **dialect.coordinator_engine_options())
    dialect.configure_engine(engine)
    _fail_lock_waits_at_once(engine, backend)
    reader_engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        metadata.create_all(reader_engine)
        with reader_engine.connect() as reader:
            yield Harness(backend, dialect, clock, engine, reader)
    finally:
        engine.dispose()
        reader_engine.dispose()


# -- the machine -----------------------------------------------------------------------


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


def _pick(choices: Sequence[T], index: int) -> T:
    return choices[index % len(choices)]


def _describe(records: dict[int, Record]) -> str:
    return "\n".join(f"  {sid}: {rec}" for sid, rec in sorted(records.items())) or "  (none)"


class ExecutionMachine(RuleBasedStateMachine):
    """Use ``machine_for(harness)``: the harness (engines, dialect) is per test."""

    harness: ClassVar[Harness]

    def __init__(self) -> None:
        super().__init__()
        self.h = self.harness
        self.h.reset()
        self.clock = self.h.clock
        self.dialect = self.h.dialect
        self.owner = Owner("stateful", 0)
        #: The model: committed execution records, committed source rows, effects.
        self.records: dict[int, Record] = {}
        self.items: dict[int, bool] = {}
        self.effects: list[tuple[int, int, str]] = []
        self.actors = [Actor(f"actor{i}") for i in range(ACTORS)]
        self.writers = [Writer(f"writer{i}") for i in range(WRITERS)]

    def teardown(self) -> None:
        for client in [*self.actors, *self.writers]:
            if client.conn is not None:
                client.conn.close()  # rolls back whatever is still open
                client.conn = client.tx = None

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
            client.held.clear()
            client.pending.clear()

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
            if not self.h.is_lock_wait(exc):
                raise
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

    # -- claiming ------------------------------------------------------------------

    @initialize(
        rows=st.lists(
            st.tuples(st.integers(1, MAX_ID), flags),
            min_size=1,
            max_size=MAX_ID - 3,
            unique_by=lambda r: r[0],
        )
    )
    def some_rows(self, rows: list[tuple[int, bool]]) -> None:
        """Start most examples with work to do, so their steps go to the interesting
        interleavings rather than to building up a table."""
        writer = self.writers[0]
        values = [{"id": sid, "eligible": flag} for sid, flag in rows]
        self._app_write(writer, lambda conn: conn.execute(insert(items), values))
        writer.pending.update(rows)
        self._end_insert(writer, commit=True)

    @precondition(lambda self: self._can_begin() and self._idle_actors())
    @rule(
        who=actor_index,
        limit=st.integers(1, MAX_CLAIM),
        keep_open=st.booleans(),
        discover_first=st.booleans(),
    )
    def claim(self, who: int, limit: int, keep_open: bool, discover_first: bool) -> None:
        """Claim a batch (after discovery, as the coordinator's loop does, or not);
        either commit at once or leave the claim in progress."""
        actor = _pick(self._idle_actors(), who)
        if discover_first:
            self._discover(actor)
        self._claim(actor, limit, keep_open)

    def _claim(self, actor: Actor, limit: int, keep_open: bool) -> list[int]:
        now = self.clock.now
        expected = self._claimable(exclude=self._locked_by_others(actor))[:limit]
        # No rows may block a claim: waiting for another claim is a finding (_run).
        claims = self._run(
            actor,
            lambda conn: self.dialect.claim(conn, WORKER, eligible(), limit, LEASE, self.owner),
        )
        got = [c.source_id for c in claims]
        if got != expected:
            raise ModelMismatch(
                f"{actor.name} claimed {got} with limit {limit} at {now}, the model says"
                f" {expected} (held by open claims: {sorted(self._locked_by_others(actor))});"
                f" eligible rows {sorted(s for s, e in self.items.items() if e)}; records:\n"
                + _describe(self.records)
            )
        for c in claims:
            before = self.records[c.source_id]
            after = transitions.claim(before, now, LEASE)
            returned = (c.token, c.attempts, c.failures, c.crashes)
            modelled = (after.token, after.attempts, after.failures, after.crashes)
            if returned != modelled:
                raise ModelMismatch(
                    f"claim of {c.source_id} returned (token, attempts, failures, crashes)"
                    f" {returned}, the claimed record is {modelled}"
                )
            actor.pending[c.source_id] = (before, after)
            note(f"claim: {before.claimable(now)}")
        if self._locked_by_others(actor):
            note("claim: while another claim is in progress")
        if not keep_open:
            self._end_claim(actor, "commit")
        return got

    @precondition(lambda self: any(a.tx is not None for a in self.actors))
    @rule(who=actor_index, how=st.sampled_from(["commit", "rollback", "crash"]))
    def end_claim(self, who: int, how: str) -> None:
        """Finish a claim in progress: commit it, roll it back, or lose the connection."""
        actor = _pick([a for a in self.actors if a.tx is not None], who)
        self._end_claim(actor, how)

    def _end_claim(self, actor: Actor, how: str) -> None:
        if how == "commit":
            for sid, (before, _) in actor.pending.items():
                if self.records[sid] != before:
                    raise ModelMismatch(
                        f"record {sid} changed to {self.records[sid]} while {actor.name}'s"
                        f" open claim held it (was {before})"
                    )
            self._commit(actor)
            for sid, (_, after) in actor.pending.items():
                self.records[sid] = after
                actor.held[sid] = after.token
        elif how == "rollback":
            self._rollback(actor)
        else:
            self._crash(actor)
        actor.pending.clear()

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

    @precondition(lambda self: self._can_act_on_claims())
    @rule(pick=any_pick)
    def renew(self, pick: int) -> None:
        self._renew(_pick(self._beliefs(), pick).actor)

    def _renew(self, actor: Actor) -> None:
        """Renew every claim the actor believes it holds; it must learn exactly which
        it lost, and a stale token must change nothing (invariant 7)."""
        now = self.clock.now
        held = [(b.sid, b.token) for b in self._beliefs() if b.actor is actor]
        renewed: dict[int, Record] = {}
        for sid, token in held:
            with contextlib.suppress(InvalidTransition):
                renewed[sid] = transitions.renew(self.records[sid], token, now, LEASE)
        expected_lost = [sid for sid, _ in held if sid not in renewed]
        lost = self._run(actor, lambda conn: self.dialect.renew(conn, WORKER, held, LEASE))
        note(f"renew: {'lost a claim' if expected_lost else 'kept every claim'}")
        if sorted(lost) != expected_lost:
            raise ModelMismatch(
                f"{actor.name} renewed {held} at {now}: the dialect reports lost"
                f" {sorted(lost)}, the model says {expected_lost}; records:\n"
                + _describe(self.records)
            )
        self._commit(actor)
        self.records.update(renewed)
        for sid in lost:
            del actor.held[sid]

    @precondition(lambda self: self._can_act_on_claims())
    @rule(pick=any_pick, crash=st.booleans())
    def finish(self, pick: int, crash: bool) -> None:
        self._complete(_pick(self._beliefs(), pick), None, crash)

    @precondition(lambda self: self._can_act_on_claims())
    @rule(pick=any_pick, delay=delays, crash=st.booleans())
    def unfinish(self, pick: int, delay: int, crash: bool) -> None:
        self._complete(_pick(self._beliefs(), pick), delay, crash)

    def _complete(self, belief: Belief, delay: int | None, crash: bool) -> None:
        """The handler writes its effect, then the transition runs in the same
        transaction; it commits only if the transition applied (``crash``: the process
        dies just before committing)."""
        actor, sid, token = belief
        kind = "finish" if delay is None else "unfinish"
        now = self.clock.now
        after: Record | None
        try:
            if delay is None:
                after = transitions.finish(self.records[sid], token)
            else:
                after = transitions.unfinish(self.records[sid], token, now, delay)
        except InvalidTransition:
            after = None

        def work(conn: Connection) -> bool:
            conn.execute(insert(effects).values(source_id=sid, token=token, kind=kind))
            if delay is None:
                return self.dialect.finish(conn, WORKER, sid, token)
            return self.dialect.unfinish(conn, WORKER, sid, token, float(delay))

        applied = self._run(actor, work)
        self._judge_fenced(belief, kind, applied, after)
        if not applied:
            self._rollback(actor)  # the stale holder's handler writes must not commit
            del actor.held[sid]
        elif crash:
            note(f"{kind}: crashed before commit")
            self._crash(actor)
        else:
            self._commit(actor)
            assert after is not None
            self.records[sid] = after
            self.effects.append((sid, token, kind))
            del actor.held[sid]

    @precondition(lambda self: self._can_act_on_claims())
    @rule(pick=any_pick, retry=retries)
    def fail(self, pick: int, retry: int | None) -> None:
        self._fail(_pick(self._beliefs(), pick), retry)

    def _fail(self, belief: Belief, retry: int | None) -> None:
        """The handler raised: FAILED, or UNFINISHED for ``retry`` seconds."""
        actor, sid, token = belief
        # What the failure policy may answer for a handler's exception: FAILED, or a
        # retry after ``retry`` seconds (which retries a policy allows is its own test's).
        decision = policy.failure(None if retry is None else float(retry))
        after: Record | None
        try:
            after = policy.apply(self.records[sid], token, decision, self.clock.now, ERROR.message)
        except InvalidTransition:
            after = None
        applied = self._run(
            actor, lambda conn: self.dialect.record(conn, WORKER, sid, token, decision, ERROR)
        )
        self._settle(belief, "fail", applied, after)

    @precondition(lambda self: self._can_act_on_claims())
    @rule(pick=any_pick)
    def release(self, pick: int) -> None:
        self._release(_pick(self._beliefs(), pick))

    def _release(self, belief: Belief) -> None:
        """The coordinator saw the handler's process die: give the item back at once."""
        actor, sid, token = belief
        after: Record | None
        # The failure policy decides from the record's crash count (a stale holder's
        # decision does not matter: its fenced release changes nothing).
        crashed = decide(Ending.CRASHED, crashes=self.records[sid].crashes, max_crashes=MAX_CRASHES)
        try:
            after = policy.apply(self.records[sid], token, crashed, self.clock.now, CRASH.message)
        except InvalidTransition:
            after = None
        applied = self._run(
            actor, lambda conn: self.dialect.record(conn, WORKER, sid, token, crashed, CRASH)
        )
        self._settle(belief, "release", applied, after)

    @precondition(lambda self: self._can_act_on_claims() and len(self._idle_actors()) > 1)
    @rule(pick=any_pick, who=actor_index)
    def lease_runs_out(self, pick: int, who: int) -> None:
        """A slow holder's lease runs out and another actor claims: recovery, and the
        usual way a holder ends up with a stale token. (advance_clock and claim can
        produce this too, but rarely in the same example.)"""
        holder = _pick(self._beliefs(), pick)
        lease = self.records[holder.sid].lease_expires_at
        if lease is not None:
            self.clock.now = max(self.clock.now, lease + 1)
        other = _pick([a for a in self._idle_actors() if a is not holder.actor], who)
        self._claim(other, MAX_ID, keep_open=False)

    @precondition(lambda self: self._can_begin() and self._stale_beliefs())
    @rule(pick=any_pick, delay=delays, retry=retries)
    def stale_holder_acts(self, pick: int, delay: int, retry: int | None) -> None:
        """A holder whose claim was taken over (its lease ran out while it worked) tries
        every fenced event in turn; each must be refused and change nothing. The rules
        above pick stale claims too, but only now and then."""
        belief = _pick(self._stale_beliefs(), pick)
        actor, sid, token = belief
        attempts: list[Callable[[], None]] = [
            lambda: self._renew(actor),
            lambda: self._complete(belief, delay, crash=False),
            lambda: self._fail(belief, retry),
            lambda: self._release(belief),
            lambda: self._complete(belief, None, crash=False),
        ]
        for attempt in attempts:
            # Each refusal drops the belief, as the real holder would; restore it so
            # the next event is tried with the same stale token.
            actor.held[sid] = token
            attempt()
        actor.held.pop(sid, None)

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

    @precondition(lambda self: any(a.held for a in self._idle_actors()))
    @rule(who=actor_index)
    def abandon(self, who: int) -> None:
        """A holder dies without anyone noticing: its claims can only expire."""
        actor = _pick([a for a in self._idle_actors() if a.held], who)
        actor.held.clear()
        if actor.conn is not None:
            actor.conn.close()
            actor.conn = None

    @rule(seconds=st.integers(0, int(LEASE * 2)))
    def advance_clock(self, seconds: int) -> None:
        """Let time pass; 0 stands for "just past the latest lease", so that takeovers
        (and with them stale holders) are common rather than a coincidence."""
        if seconds == 0:
            leases = [r.lease_expires_at for r in self.records.values() if r.lease_expires_at]
            self.clock.now = max([self.clock.now, *leases]) + 1
        else:
            self.clock.now += seconds

    # -- discovery -------------------------------------------------------------------

    @precondition(lambda self: self._can_begin() and self._idle_actors())
    @rule(who=actor_index)
    def discover(self, who: int) -> None:
        """New rows above the watermark get pending records (and only those)."""
        self._discover(_pick(self._idle_actors(), who))

    def _discover(self, actor: Actor) -> None:
        watermark = max(self.records, default=None)
        expected = [s for s in sorted(self.items) if watermark is None or s > watermark]
        added = self._run(actor, lambda conn: self.dialect.discover(conn, WORKER))
        self._commit(actor)
        self._judge_discovery("discover", added, expected)

    @precondition(lambda self: self._can_begin() and self._idle_actors())
    @rule(who=actor_index, above=st.none() | st.integers(0, MAX_ID))
    def sweep(self, who: int, above: int | None) -> None:
        """Every committed row (above ``above``) without a record gets one, wherever it
        is relative to the watermark: this is what rescues out-of-order commits."""
        actor = _pick(self._idle_actors(), who)
        self._sweep(actor, above)

    def _sweep(self, actor: Actor, above: int | None) -> None:
        expected = [
            s for s in sorted(self.items) if s not in self.records and (above is None or s > above)
        ]
        added = self._run(actor, lambda conn: self.dialect.sweep(conn, WORKER, above))
        self._commit(actor)
        self._judge_discovery(f"sweep(above={above})", added, expected)

    def _judge_discovery(self, what: str, added: int, expected: list[int]) -> None:
        if added != len(expected):
            raise ModelMismatch(
                f"{what} added {added} records, the model expects {expected}"
                f" (committed rows {sorted(self.items)}, records {sorted(self.records)})"
            )
        watermark = max(self.records, default=None)
        for sid in expected:
            self.records[sid] = Record()
            if watermark is not None and sid < watermark:
                note(f"{what.partition('(')[0]}: found a row below the watermark")

    # -- the application -----------------------------------------------------------

    @precondition(
        lambda self: (
            self._can_begin()
            and self._idle_writers()
            and len(self.items) + sum(len(w.pending) for w in self.writers) < MAX_ID
        )
    )
    @rule(who=writer_index, wanted=st.integers(1, MAX_ID), flag=flags, hold=st.booleans())
    def insert_row(self, who: int, wanted: int, flag: bool, hold: bool) -> None:
        """Insert a source row, in any key order; ``hold`` keeps its transaction open, so
        a larger key inserted meanwhile can commit (and be discovered) first."""
        writer = _pick(self._idle_writers(), who)
        taken = set(self.items).union(*(w.pending for w in self.writers))
        sid = next(
            candidate
            for offset in range(MAX_ID)
            if (candidate := (wanted - 1 + offset) % MAX_ID + 1) not in taken
        )
        self._app_write(
            writer, lambda conn: conn.execute(insert(items).values(id=sid, eligible=flag))
        )
        writer.pending[sid] = flag
        if not hold:
            self._end_insert(writer, commit=True)

    @precondition(lambda self: any(w.tx is not None for w in self.writers))
    @rule(who=writer_index, commit=st.booleans())
    def end_insert(self, who: int, commit: bool) -> None:
        writer = _pick([w for w in self.writers if w.tx is not None], who)
        self._end_insert(writer, commit)

    def _end_insert(self, writer: Writer, commit: bool) -> None:
        if commit:
            self._commit(writer)
            self.items.update(writer.pending)
        else:
            self._rollback(writer)
        writer.pending.clear()

    @precondition(lambda self: self._can_begin() and self._idle_writers() and self.items)
    @rule(who=writer_index, pick=any_pick)
    def flip_eligibility(self, who: int, pick: int) -> None:
        writer = _pick(self._idle_writers(), who)
        sid = _pick(sorted(self.items), pick)
        value = not self.items[sid]
        self._app_write(
            writer,
            lambda conn: conn.execute(
                update(items).where(items.c.id == sid).values(eligible=value)
            ),
        )
        self._commit(writer)
        self.items[sid] = value

    def _app_write(self, writer: Writer, work: Callable[[Connection], object]) -> None:
        # dbworker must never hold the application's rows: an application write that
        # has to wait for a claim in progress is a finding (_run reports it).
        self._run(writer, work)

    @precondition(lambda self: self._can_begin() and self._idle_writers() and self.records)
    @rule(who=writer_index, pick=any_pick, failed_only=st.booleans())
    def reset_failed(self, who: int, pick: int, failed_only: bool) -> None:
        writer = _pick(self._idle_writers(), who)
        # Not a row a claim in progress holds: MariaDB makes even a non-matching
        # UPDATE by primary key wait for the row lock (see _beliefs).
        unlocked = sorted(set(self.records) - self._locked_by_others(writer))
        if not unlocked:
            return
        failed = [s for s in unlocked if self.records[s].phase is Phase.FAILED]
        sid = _pick(failed if failed_only and failed else unlocked, pick)
        after: Record | None
        try:
            after = transitions.reset_failed(self.records[sid])
        except InvalidTransition:
            after = None
        applied = self._run(writer, lambda conn: self.dialect.reset_failed(conn, WORKER, sid))
        if applied != (after is not None):
            raise ModelMismatch(
                f"reset_failed({sid}) returned {applied} for record {self.records[sid]}"
            )
        self._commit(writer)
        if after is not None:
            self.records[sid] = after

    # -- liveness ------------------------------------------------------------------------

    @precondition(lambda self: all(c.tx is None for c in self._clients()))
    @rule(who=actor_index)
    def drain(self, who: int) -> None:
        """Invariant 5 (no loss): let every lease and delay run out, sweep, claim
        everything. Every committed eligible row that is not FINISHED or FAILED must be
        claimed now."""
        deadlines = [
            t
            for r in self.records.values()
            for t in (r.lease_expires_at, r.not_before)
            if t is not None
        ]
        self.clock.now = max([self.clock.now, *deadlines]) + 1
        actor = _pick(self.actors, who)
        self._sweep(actor, None)
        owed = sorted(
            sid
            for sid, flag in self.items.items()
            if flag and self.records[sid].phase not in TERMINAL
        )
        claimed = self._claim(actor, MAX_ID, keep_open=False)
        if claimed != owed:
            raise ModelMismatch(f"after expiry and a sweep, a claim got {claimed}, owed {owed}")

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def check_committed_state(self) -> None:
        result = self.h.reader.execute(self.h.state_query, {"now": self.clock.now}).all()
        rows = [row[1:] for row in result if row[0] != 2]
        stored = {
            row[0]: Record(
                Phase(row[1]),
                int(row[2]),
                None if row[3] is None else float(row[3]),
                None if row[4] is None else float(row[4]),
                int(row[5]),
                int(row[6]),
                int(row[7]),
                row[8],
            )
            for row in rows
        }
        if stored != self.records:
            diff = {
                sid: (stored.get(sid), self.records.get(sid))
                for sid in set(stored) | set(self.records)
                if stored.get(sid) != self.records.get(sid)
            }
            raise ModelMismatch(
                "execution rows differ from the model (database, model):\n"
                + "\n".join(f"  {sid}: {pair}" for sid, pair in sorted(diff.items()))
            )

        # Invariants 3 (terminal) and 4 (recovery), through the dialect's own guard SQL.
        guard = {row[1] for row in result if row[0] == 1}
        model = {sid for sid, r in self.records.items() if r.claimable(self.clock.now)}
        if guard != model:
            raise ModelMismatch(
                f"the dialect's claim guard admits {sorted(guard)} at {self.clock.now},"
                f" the model {sorted(model)}; records:\n" + _describe(self.records)
            )

        # Invariant 2 (atomic): an effect is committed iff its transition committed.
        written = sorted((int(row[1]), int(row[3]), row[2]) for row in result if row[0] == 2)
        if written != sorted(self.effects):
            raise ModelMismatch(f"handler effects {written}, committed transitions {self.effects}")

        # Invariant 1 (exclusive): one believer per current token.
        for sid, record in self.records.items():
            believers = [a.name for a in self.actors if a.held.get(sid) == record.token]
            if record.phase is Phase.WORKING and len(believers) > 1:
                raise ModelMismatch(f"{believers} all hold the current token of {sid}")


def machine_for(harness: Harness) -> type[ExecutionMachine]:
    """A machine class bound to one test's harness (engines are per test, not per
    example)."""
    return type(
        f"ExecutionMachine_{harness.backend}",
        (ExecutionMachine,),
        {"harness": harness},
    )
