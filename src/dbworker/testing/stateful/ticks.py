"""The tick rule: coordinators make periodic workers' slots into tick rows, the same
slot by several of them, and each slot must be exactly one row."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule
from sqlalchemy import select
from sqlalchemy.exc import DBAPIError

from .base import MachineBase, actor_index, choose
from .harness import ModelMismatch, ticks


class TickRules(MachineBase):
    """``Dialect.insert_ticks``: an insert of a slot already made is ignored."""

    @precondition(lambda self: self._can_begin() and self._idle_actors())
    @rule(who=actor_index, worker=st.sampled_from(["beat", "other"]), slot=st.integers(1, 3))
    def make_tick(self, who: int, worker: str, slot: int) -> None:
        actor = choose(self._idle_actors(), who)
        try:
            self._run(actor, lambda conn: self.dialect.insert_ticks(conn, ticks, worker, [slot]))
        except DBAPIError as exc:
            raise ModelMismatch(
                f"{actor.name} could not make slot {slot} of {worker} (made already:"
                f" {sorted(self.made_ticks)}): {exc.orig}"
            ) from exc
        self._commit(actor)
        self.made_ticks.add((worker, slot))
        rows = sorted(
            (worker, int(slot))
            for worker, slot in self.h.reader.execute(select(ticks.c.worker, ticks.c.slot))
        )
        if rows != sorted(self.made_ticks):
            raise ModelMismatch(f"tick rows {rows}, the slots made {sorted(self.made_ticks)}")
