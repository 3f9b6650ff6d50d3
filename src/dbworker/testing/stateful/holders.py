"""Rules for a holder's fenced events: renew, finish (also alone), unfinish, fail and
release (with current and stale tokens alike), a lease that runs out, a holder that
vanishes, and time passing."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from hypothesis import event as note
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule
from sqlalchemy import Connection, insert

from ...core import policy, transitions
from ...core.errors import InvalidTransition
from ...core.policy import FINISHED, Decision, Ending, decide
from ...core.transitions import Record
from ...dialects import ErrorInfo
from .base import Actor, Belief, actor_index, any_pick, choose, delays, describe, retries
from .claims import ClaimRules
from .harness import CRASH, ERROR, LEASE, MAX_CRASHES, MAX_ID, WORKER, ModelMismatch, effects


class HolderRules(ClaimRules):
    """What the holder of a claim does with it, or fails to do."""

    @precondition(lambda self: self._can_act_on_claims())
    @rule(pick=any_pick)
    def renew(self, pick: int) -> None:
        self._renew(choose(self._beliefs(), pick).actor)

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
                + describe(self.records)
            )
        self._commit(actor)
        self.records.update(renewed)
        for sid in lost:
            del actor.held[sid]

    @precondition(lambda self: self._can_act_on_claims())
    @rule(pick=any_pick, crash=st.booleans())
    def finish(self, pick: int, crash: bool) -> None:
        self._complete(choose(self._beliefs(), pick), None, crash)

    @precondition(lambda self: self._can_act_on_claims())
    @rule(pick=any_pick, delay=delays, crash=st.booleans())
    def unfinish(self, pick: int, delay: int, crash: bool) -> None:
        self._complete(choose(self._beliefs(), pick), delay, crash)

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
    @rule(pick=any_pick, crash=st.booleans())
    def finish_all(self, pick: int, crash: bool) -> None:
        self._finish_all(choose(self._beliefs(), pick).actor, crash)

    def _finish_all(self, actor: Actor, crash: bool) -> None:
        """A group's end: the handlers wrote their effects, then every claim the actor
        believes it holds is finished in one statement (``Dialect.finish_all``). It must
        match exactly the claims still current; the group commits only if that is all
        of them (else the real process runs each item again alone)."""
        beliefs = [b for b in self._beliefs() if b.actor is actor]
        held = [(b.sid, b.token) for b in beliefs]
        after: dict[int, Record] = {}
        for sid, token in held:
            with contextlib.suppress(InvalidTransition):
                after[sid] = transitions.finish(self.records[sid], token)

        def work(conn: Connection) -> int:
            for sid, token in held:
                conn.execute(insert(effects).values(source_id=sid, token=token, kind="finish"))
            return self.dialect.finish_all(conn, WORKER, held)

        matched = self._run(actor, work)
        note(f"finish_all: {'every claim current' if len(after) == len(held) else 'one lost'}")
        if matched != len(after):
            self._rollback(actor)
            raise ModelMismatch(
                f"{actor.name}: finish_all({held}) at {self.clock.now} matched {matched}"
                f" rows, the model allows {sorted(after)}; records:\n" + describe(self.records)
            )
        if matched < len(held):
            self._rollback(actor)
            for sid, _ in held:
                if sid not in after:
                    del actor.held[sid]
        elif crash:
            note("finish_all: crashed before commit")
            self._crash(actor)
        else:
            self._commit(actor)
            for sid, token in held:
                self.records[sid] = after[sid]
                self.effects.append((sid, token, "finish"))
                del actor.held[sid]

    @precondition(lambda self: self._can_act_on_claims())
    @rule(pick=any_pick)
    def finish_alone(self, pick: int) -> None:
        self._finish_alone(choose(self._beliefs(), pick))

    def _finish_alone(self, belief: Belief) -> None:
        """A handler that wrote nothing ends: its FINISH is a transaction of its own
        (``Dialect.record_alone``), committed when the call returns, fenced as always."""
        actor, sid, token = belief
        after: Record | None
        try:
            after = transitions.finish(self.records[sid], token)
        except InvalidTransition:
            after = None
        applied = self._alone(
            actor, lambda conn: self.dialect.record_alone(conn, WORKER, sid, token, FINISHED)
        )
        self._judge_fenced(belief, "finish_alone", applied, after)
        if applied:
            assert after is not None
            self.records[sid] = after
        del actor.held[sid]

    @precondition(lambda self: self._can_act_on_claims())
    @rule(pick=any_pick, retry=retries)
    def fail(self, pick: int, retry: int | None) -> None:
        self._fail(choose(self._beliefs(), pick), retry)

    def _fail(self, belief: Belief, retry: int | None) -> None:
        """The handler raised: FAILED, or UNFINISHED for ``retry`` seconds."""
        # What the failure policy may answer for a handler's exception: FAILED, or a
        # retry after ``retry`` seconds (which retries a policy allows is its own test's).
        decision = policy.failure(None if retry is None else float(retry))
        self._record(belief, "fail", decision, ERROR)

    @precondition(lambda self: self._can_act_on_claims())
    @rule(pick=any_pick)
    def release(self, pick: int) -> None:
        self._release(choose(self._beliefs(), pick))

    def _release(self, belief: Belief) -> None:
        """The coordinator saw the handler's process die: give the item back at once."""
        # The failure policy decides from the record's crash count (a stale holder's
        # decision does not matter: its fenced release changes nothing).
        crashes = self.records[belief.sid].crashes
        crashed = decide(Ending.CRASHED, crashes=crashes, max_crashes=MAX_CRASHES)
        self._record(belief, "release", crashed, CRASH)

    def _record(self, belief: Belief, event: str, decision: Decision, error: ErrorInfo) -> None:
        """``Dialect.record`` of ``decision`` against ``policy.apply``, its model."""
        actor, sid, token = belief
        after: Record | None
        try:
            after = policy.apply(self.records[sid], token, decision, self.clock.now, error.message)
        except InvalidTransition:
            after = None
        applied = self._run(
            actor, lambda conn: self.dialect.record(conn, WORKER, sid, token, decision, error)
        )
        self._settle(belief, event, applied, after)

    @precondition(lambda self: self._can_act_on_claims() and len(self._idle_actors()) > 1)
    @rule(pick=any_pick, who=actor_index)
    def lease_runs_out(self, pick: int, who: int) -> None:
        """A slow holder's lease runs out and another actor claims: recovery, and the
        usual way a holder ends up with a stale token. (advance_clock and claim can
        produce this too, but rarely in the same example.)"""
        holder = choose(self._beliefs(), pick)
        lease = self.records[holder.sid].lease_expires_at
        if lease is not None:
            self.clock.now = max(self.clock.now, lease + 1)
        other = choose([a for a in self._idle_actors() if a is not holder.actor], who)
        self._claim(other, MAX_ID, keep_open=False)

    @precondition(lambda self: self._can_begin() and self._stale_beliefs())
    @rule(pick=any_pick, delay=delays, retry=retries)
    def stale_holder_acts(self, pick: int, delay: int, retry: int | None) -> None:
        """A holder whose claim was taken over (its lease ran out while it worked) tries
        every fenced event in turn; each must be refused and change nothing. The rules
        above pick stale claims too, but only now and then."""
        belief = choose(self._stale_beliefs(), pick)
        actor, sid, token = belief
        attempts: list[Callable[[], None]] = [
            lambda: self._renew(actor),
            lambda: self._complete(belief, delay, crash=False),
            lambda: self._fail(belief, retry),
            lambda: self._release(belief),
            lambda: self._complete(belief, None, crash=False),
            lambda: self._finish_alone(belief),
        ]
        for attempt in attempts:
            # Each refusal drops the belief, as the real holder would; restore it so
            # the next event is tried with the same stale token.
            actor.held[sid] = token
            attempt()
        actor.held.pop(sid, None)

    @precondition(lambda self: any(a.held for a in self._idle_actors()))
    @rule(who=actor_index)
    def abandon(self, who: int) -> None:
        """A holder dies without anyone noticing: its claims can only expire."""
        actor = choose([a for a in self._idle_actors() if a.held], who)
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
