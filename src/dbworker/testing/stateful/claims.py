"""Rules for claims: a batch claimed and committed at once or left in progress while
others act, ended by a commit, a rollback or a lost connection; and ``drain``, which
lets every lease and delay run out and requires every owed row to be claimed."""

from __future__ import annotations

from hypothesis import event as note
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule
from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from ...core import transitions
from ...core.status import TERMINAL
from ...dialects import Claim
from .base import Actor, actor_index, choose, describe
from .harness import LEASE, MAX_CLAIM, MAX_ID, WORKER, ModelMismatch, eligible
from .rows import RowRules


class ClaimRules(RowRules):
    """Claims, as the coordinator's loop makes them."""

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
        actor = choose(self._idle_actors(), who)
        if discover_first:
            self._discover(actor)
        self._claim(actor, limit, keep_open)

    @precondition(lambda self: self._can_begin() and self._idle_actors())
    @rule(who=actor_index, limit=st.integers(1, MAX_CLAIM), discover_first=st.booleans())
    def claim_as_scheduler(self, who: int, limit: int, discover_first: bool) -> None:
        """Discover (or not) and claim in one transaction on the connection a scheduler
        keeps (``Dialect.scheduler_connection``, where PostgreSQL sends each as a
        transaction of its own), committed at once, as the coordinator's loop does."""
        actor = choose(self._idle_actors(), who)
        conn = actor.scheduler
        if conn is None:
            conn = actor.scheduler = self.h.engine.connect()
            self.dialect.scheduler_connection(conn)
        watermark = max(self.records, default=None)
        new = [s for s in sorted(self.items) if watermark is None or s > watermark]
        with conn.begin():
            try:
                if discover_first:
                    added = self.dialect.discover(conn, WORKER)
                    self._judge_discovery("discover as the scheduler", added, new)
                self._claim(actor, limit, keep_open=True, on=conn)
            except DBAPIError as exc:
                self._fail_on_lock_wait(actor, exc)
                raise
        self._claims_committed(actor)

    def _claim(
        self, actor: Actor, limit: int, keep_open: bool, on: Connection | None = None
    ) -> list[int]:
        """Claim up to ``limit`` in a new transaction of ``actor`` (``on``: in the one
        open on that connection instead, left to the caller to end)."""
        now = self.clock.now
        expected = self._claimable(exclude=self._locked_by_others(actor))[:limit]

        def claim(conn: Connection) -> list[Claim]:
            return self.dialect.claim(conn, WORKER, eligible(), limit, LEASE, self.owner)

        # No rows may block a claim: waiting for another claim is a finding (_run).
        claims = claim(on) if on is not None else self._run(actor, claim)
        got = [c.source_id for c in claims]
        if got != expected:
            raise ModelMismatch(
                f"{actor.name} claimed {got} with limit {limit} at {now}, the model says"
                f" {expected} (held by open claims: {sorted(self._locked_by_others(actor))});"
                f" eligible rows {sorted(s for s, e in self.items.items() if e)}; records:\n"
                + describe(self.records)
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
        if not keep_open and on is None:
            self._end_claim(actor, "commit")
        return got

    @precondition(lambda self: any(a.tx is not None for a in self.actors))
    @rule(who=actor_index, how=st.sampled_from(["commit", "rollback", "crash"]))
    def end_claim(self, who: int, how: str) -> None:
        """Finish a claim in progress: commit it, roll it back, or lose the connection."""
        actor = choose([a for a in self.actors if a.tx is not None], who)
        self._end_claim(actor, how)

    def _end_claim(self, actor: Actor, how: str) -> None:
        if how == "commit":
            for sid, (before, _) in actor.pending.items():
                if self.records[sid] != before:
                    raise ModelMismatch(
                        f"record {sid} changed to {self.records[sid]} while {actor.name}'s"
                        f" open claim held it (was {before})"
                    )
            for sid, (before, _) in actor.keyed_pending.items():
                if self.keyed_records[sid] != before:
                    raise ModelMismatch(
                        f"keyed record {sid} changed to {self.keyed_records[sid]} while"
                        f" {actor.name}'s open claim held it (was {before})"
                    )
            self._commit(actor)
            self._claims_committed(actor)
            return
        if how == "rollback":
            self._rollback(actor)
        else:
            self._crash(actor)
        actor.pending.clear()
        actor.keyed_pending.clear()

    def _claims_committed(self, actor: Actor) -> None:
        """``actor``'s claims in progress committed: the model's records and its beliefs."""
        for sid, (_, after) in actor.pending.items():
            self.records[sid] = after
            actor.held[sid] = after.token
        for sid, (_, after) in actor.keyed_pending.items():
            self.keyed_records[sid] = after
            actor.keyed_held[sid] = after.token
        actor.pending.clear()
        actor.keyed_pending.clear()

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
        actor = choose(self.actors, who)
        self._sweep(actor, None)
        owed = sorted(
            sid
            for sid, flag in self.items.items()
            if flag and self.records[sid].phase not in TERMINAL
        )
        claimed = self._claim(actor, MAX_ID, keep_open=False)
        if claimed != owed:
            raise ModelMismatch(f"after expiry and a sweep, a claim got {claimed}, owed {owed}")
