"""Rules for the source rows: the application inserts them (in any key order, holding
some transactions open), flips their eligibility and resets failed records; coordinators
discover them above the watermark and sweep for the ones below it."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import event as note
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule
from sqlalchemy import Connection, insert, update

from ...core import transitions
from ...core.errors import InvalidTransition
from ...core.status import Phase
from ...core.transitions import Record, Transition
from ...dialects.base import CANCELLED
from .base import Actor, MachineBase, Writer, actor_index, any_pick, choose, flags, writer_index
from .harness import MAX_ID, WORKER, ModelMismatch, items


class RowRules(MachineBase):
    """The application's writes, and the discovery that turns rows into records."""

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
    @rule(who=actor_index)
    def discover(self, who: int) -> None:
        """New rows above the watermark get pending records (and only those)."""
        self._discover(choose(self._idle_actors(), who))

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
        actor = choose(self._idle_actors(), who)
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
        writer = choose(self._idle_writers(), who)
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
        writer = choose([w for w in self.writers if w.tx is not None], who)
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
        writer = choose(self._idle_writers(), who)
        sid = choose(sorted(self.items), pick)
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
        writer = choose(self._idle_writers(), who)
        # Not a row a claim in progress holds: MariaDB makes even a non-matching
        # UPDATE by primary key wait for the row lock (see _beliefs).
        unlocked = sorted(set(self.records) - self._locked_by_others(writer))
        if not unlocked:
            return
        failed = [s for s in unlocked if self.records[s].phase is Phase.FAILED]
        sid = choose(failed if failed_only and failed else unlocked, pick)
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

    @precondition(lambda self: self._can_begin() and self._idle_writers() and self.items)
    @rule(who=writer_index, pick=any_pick)
    def cancel(self, who: int, pick: int) -> None:
        """The application cancels an item (``coordinator.cancel``): the CANCEL row of an
        open record, or of a committed row not discovered yet, which gets its record
        first (so that no discovery makes it pending later); nothing for a terminal one.
        Its holder, if any, still believes it holds the token and must learn otherwise."""
        writer = choose(self._idle_writers(), who)
        unlocked = sorted(set(self.items) - self._locked_by_others(writer))
        if not unlocked:
            return
        sid = choose(unlocked, pick)
        before = self.records.get(sid, Record())
        after: Record | None
        try:
            after = transitions.apply(before, Transition.CANCEL, error=CANCELLED.message)
        except InvalidTransition:
            after = None
        note(f"cancel: {before.phase.value if sid in self.records else 'undiscovered'}")
        applied = self._run(writer, lambda conn: self.dialect.cancel(conn, WORKER, sid))
        if applied != (after is not None):
            raise ModelMismatch(
                f"cancel({sid}) returned {applied} for record "
                f"{self.records.get(sid, 'none (not discovered)')}"
            )
        self._commit(writer)
        if after is not None:
            self.records[sid] = after
