"""The core transition model against a dialect's SQL, as a Hypothesis state machine
(the rules live in ``rows.py``, ``claims.py`` and ``holders.py``; their plumbing in
``base.py``; the tables and engines in ``harness.py``).

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
An actor also claims as the scheduler does, on a connection of its own set up as the
scheduler keeps one (``claim_as_scheduler``: on PostgreSQL its discovery and claim
commit by themselves), which goes back to the pool at the end of each example as the
scheduler lets it go: a claim committed where the model believes it still open shows.

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
8. Keyed exclusivity (``KeyedRules``, issue 26): never two WORKING records of an
   ``exclusive_by`` worker with equal keys, each holding its key in ``held_key``; a
   claim takes one record per key and none of a busy key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hypothesis.stateful import invariant, run_state_machine_as_test

from ...core.status import Phase
from ...core.transitions import Record
from ..harness import DialectFactory
from .base import describe
from .harness import ModelMismatch, StatefulHarness, open_harness
from .holders import HolderRules
from .keyed import KeyedRules
from .ticks import TickRules

if TYPE_CHECKING:
    from hypothesis import settings as Settings


class ExecutionMachine(HolderRules, TickRules, KeyedRules):
    """Every rule, and the invariants checked after each step. Use
    ``machine_for(harness)``: the harness (engines, dialect) is per test."""

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
                f" the model {sorted(model)}; records:\n" + describe(self.records)
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


def machine_for(harness: StatefulHarness) -> type[ExecutionMachine]:
    """A machine class bound to one test's harness (engines are per test, not per
    example)."""
    return type(
        f"ExecutionMachine_{harness.backend}",
        (ExecutionMachine,),
        {"harness": harness},
    )


def run_machine(
    make_dialect: DialectFactory, url: str, *, settings: Settings | None = None
) -> None:
    """Run the state machine against the dialect ``make_dialect`` makes (from the kit's
    clock) on the database ``url`` names, under ``settings`` (a ``hypothesis.settings``;
    by default the profile loaded now). Raises ``ModelMismatch`` for what it caught."""
    with open_harness(url, make_dialect) as harness:
        run_state_machine_as_test(machine_for(harness), settings=settings)
