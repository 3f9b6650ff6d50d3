"""Rules for a worker with ``exclusive_by`` (issue 26): the same rows, claimed by a
second worker whose items share keys (``key_of``), finished by their holders, taken
over once their lease runs out, checked after every step against the model.

The model: a keyed record is claimable as the core model says, unless another record
of its key is WORKING (expired or not: an expired holder is taken over as itself and
keeps its key); a claim takes at most one record per key, in the eligible order. The
invariant (``check_keyed_state``): never two WORKING records with equal keys, and each
WORKING record's ``held_key`` is its key (NULL otherwise).

A claim while another actor's keyed claim is open may meet that claim at ``held_key``'s
unique index (MySQL waits there, even for a key the other did not take, since its
duplicate check locks a range; PostgreSQL skips a key another claim is taking): a lock
wait then is legitimate, and the claim is judged on safety alone (every record it took
is claimable, of a free key, one per key), then rolled back: whether MySQL waits depends
on when it purges old index entries, and the steps that follow must not. A sweep or a
finish meanwhile may wait there too on MySQL (the NULL it writes may fall in that
range): it is left for a later step. With no other keyed claim open, a wait is a finding
and every step must do exactly what the model says.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import event as note
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule
from sqlalchemy import select
from sqlalchemy.exc import DBAPIError

from ...core import transitions
from ...core.errors import InvalidTransition
from ...core.status import Phase
from ...core.transitions import Record
from .base import Actor, Belief, MachineBase, actor_index, any_pick, choose, describe
from .harness import KEYED, LEASE, MAX_CLAIM, ModelMismatch, eligible, key_of, keyed_executions


class KeyedRules(MachineBase):
    """Claims and completions of the keyed worker, and its exclusivity invariant."""

    def _busy_keys(self) -> dict[str, int]:
        """Committed WORKING keyed records by key (lease run out or not)."""
        return {
            key_of(sid): sid for sid, r in self.keyed_records.items() if r.phase is Phase.WORKING
        }

    def _keyed_expected(self, limit: int) -> list[int]:
        now, busy, taken = self.clock.now, self._busy_keys(), set()
        expected = []
        for sid, record in sorted(self.keyed_records.items()):
            key = key_of(sid)
            if not self.items.get(sid, False) or record.claimable(now) is None:
                continue
            if busy.get(key, sid) != sid or key in taken:
                continue
            taken.add(key)
            expected.append(sid)
        return expected[:limit]

    def _others_keyed(self, actor: Actor) -> dict[int, tuple[Record, Record]]:
        return {
            sid: pair
            for a in self.actors
            if a is not actor
            for sid, pair in a.keyed_pending.items()
        }

    @precondition(lambda self: self._can_begin() and self._idle_actors())
    @rule(who=actor_index, limit=st.integers(1, MAX_CLAIM), keep_open=st.booleans())
    def claim_keyed(self, who: int, limit: int, keep_open: bool) -> None:
        """Sweep the keyed worker's records in (committed), then claim a batch of them."""
        actor = choose(self._idle_actors(), who)
        expected_new = [s for s in sorted(self.items) if s not in self.keyed_records]
        try:
            added = self._run(actor, lambda conn: self.dialect.sweep(conn, KEYED, None))
        except ModelMismatch as exc:
            if not self._key_index_wait(actor, exc):
                raise
            note("keyed sweep: waited at the key index for another open claim")
            return
        self._commit(actor)
        if added != len(expected_new):
            raise ModelMismatch(f"keyed sweep added {added} records, expected {expected_new}")
        for sid in expected_new:
            self.keyed_records[sid] = Record()

        now = self.clock.now
        others = self._others_keyed(actor)
        contended = bool(others)
        try:
            claims = self._run(
                actor,
                lambda conn: self.dialect.claim(conn, KEYED, eligible(), limit, LEASE, self.owner),
            )
        except ModelMismatch as exc:
            if not contended or not isinstance(exc.__cause__, DBAPIError):
                raise
            note("keyed claim: waited at the key index for another open claim")
            return
        got = [c.source_id for c in claims]
        if not contended:
            expected = self._keyed_expected(limit)
            if got != expected:
                raise ModelMismatch(
                    f"{actor.name} claimed keyed {got} with limit {limit} at {now}, the model"
                    f" says {expected}; eligible {sorted(s for s, e in self.items.items() if e)}"
                    "; keyed records:\n" + describe(self.keyed_records)
                )
        else:
            # Judged, then rolled back: whether MySQL waits depends on its purge of old
            # index entries (timing), and what follows must not depend on that.
            self._judge_contended(got, limit, others)
            self._rollback(actor)
            note(f"keyed claim: {len(got)} while another keyed claim is open")
            return
        for c in claims:
            before = self.keyed_records[c.source_id]
            after = transitions.claim(before, now, LEASE)
            if c.token != after.token:
                raise ModelMismatch(f"keyed claim of {c.source_id}: token {c.token}, model {after}")
            actor.keyed_pending[c.source_id] = (before, after)
        note(f"keyed claim: {len(got)}")
        if not keep_open:
            self._commit(actor)
            for sid, (_, after) in actor.keyed_pending.items():
                self.keyed_records[sid] = after
                actor.keyed_held[sid] = after.token
            actor.keyed_pending.clear()

    def _key_index_wait(self, actor: Actor, exc: ModelMismatch) -> bool:
        """Whether ``actor``'s step waited legitimately: it wrote a NULL into
        ``held_key``'s unique index (a sweep's new records, a finish), which may fall in
        the range an open keyed claim's duplicate check locked (MySQL, depending on when
        it purges old entries). The real caller waits for that claim to end."""
        return (
            bool(self._others_keyed(actor))
            and self.h.server.unique_checks_lock_ranges
            and isinstance(exc.__cause__, DBAPIError)
        )

    def _judge_contended(
        self, got: list[int], limit: int, others: dict[int, tuple[Record, Record]]
    ) -> None:
        """Safety only: what a claim racing other open claims took must be claimable."""
        allowed = set(self._keyed_expected(len(self.keyed_records)))
        now, busy = self.clock.now, self._busy_keys()
        claimable = {
            sid
            for sid, r in self.keyed_records.items()
            if self.items.get(sid, False)
            and r.claimable(now) is not None
            and busy.get(key_of(sid), sid) == sid
        }
        keys = [key_of(sid) for sid in got]
        other_keys = {key_of(sid) for sid in others}
        if (
            len(got) > limit
            or got != sorted(got)
            or len(set(keys)) != len(keys)
            or not set(got) <= claimable
            or set(got) & set(others)
            or set(keys) & other_keys
        ):
            raise ModelMismatch(
                f"a keyed claim racing open claims of {sorted(others)} took {got} (limit"
                f" {limit}); claimable alone {sorted(allowed)}; keyed records:\n"
                + describe(self.keyed_records)
            )

    def _keyed_beliefs(self) -> list[Belief]:
        return [
            Belief(actor, sid, token)
            for actor in self._idle_actors()
            for sid, token in sorted(actor.keyed_held.items())
            if sid not in self._others_keyed(actor)
        ]

    @precondition(lambda self: self._can_begin() and bool(self._keyed_beliefs()))
    @rule(pick=any_pick)
    def finish_keyed(self, pick: int) -> None:
        """A keyed holder finishes (its token may be stale): the key is free again."""
        actor, sid, token = choose(self._keyed_beliefs(), pick)
        try:
            after: Record | None = transitions.finish(self.keyed_records[sid], token)
        except InvalidTransition:
            after = None
        try:
            applied = self._run(actor, lambda conn: self.dialect.finish(conn, KEYED, sid, token))
        except ModelMismatch as exc:
            if not self._key_index_wait(actor, exc):
                raise
            # The holder keeps its belief, to finish in a later step.
            note("keyed finish: waited at the key index for another open claim")
            return
        if applied != (after is not None):
            raise ModelMismatch(
                f"keyed finish({sid}, token={token}) {'applied' if applied else 'was refused'};"
                f" the model's record is {self.keyed_records[sid]}"
            )
        if applied:
            self._commit(actor)
            assert after is not None
            self.keyed_records[sid] = after
        else:
            self._rollback(actor)
        del actor.keyed_held[sid]

    @invariant()
    def check_keyed_state(self) -> None:
        """The keyed records equal the model's, and no two WORKING ones share a key."""
        t = keyed_executions
        query = select(t.c.source_id, t.c.status, t.c.token, t.c.held_key)
        rows = [tuple(row) for row in self.h.reader.execute(query)]
        _check_keyed_rows(rows, self.keyed_records)


def _check_keyed_rows(rows: Sequence[tuple[Any, ...]], model: dict[int, Record]) -> None:
    working: dict[str, int] = {}
    stored = {int(sid): (Phase(status), int(token)) for sid, status, token, _ in rows}
    for sid, status, _, held in rows:
        phase = Phase(status)
        if phase is Phase.WORKING:
            key = key_of(int(sid))
            if key in working:
                raise ModelMismatch(
                    f"records {working[key]} and {sid} are both WORKING with key {key!r}"
                )
            working[key] = int(sid)
            if held != key:
                raise ModelMismatch(f"WORKING record {sid} holds key {held!r}, its key is {key!r}")
        elif held is not None:
            raise ModelMismatch(f"record {sid} is {phase.value} but still holds key {held!r}")
    modelled = {sid: (r.phase, r.token) for sid, r in model.items()}
    if stored != modelled:
        raise ModelMismatch(
            f"keyed records (phase, token) differ: database {stored}, model {modelled}"
        )
