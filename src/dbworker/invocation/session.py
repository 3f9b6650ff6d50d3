"""The session a handler receives."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

from ..core.errors import HandlerContractError


def listened(dispatch: Any, events: Iterable[str]) -> bool:
    """Whether any of ``events`` has a listener on ``dispatch`` (a session's, a mapper's
    or a class's): checked at each use, as listeners may be added at any time."""
    return any(getattr(dispatch, name) for name in events)


class HandlerSession(Session):
    """The session a handler receives. dbworker owns its commit and its cleanup."""

    _dbworker_guarded = False
    _dbworker_misuse: str | None = None
    #: Its handler returned holding no transaction, and its ending was handed over to
    #: be committed with others' (``together.py``): its connection went back then.
    _dbworker_parted = False
    #: Lends the session its connection at its first statement, where it was made with
    #: none: a handler that sends none (an I/O wait, its row read apart, its writes
    #: ending with others') holds no connection, and a wave of 50 such handlers does not
    #: open 50 connections (``benchmarks.io``'s worker opened 58 in all, 8 now: each
    #: connect cost the handler process about 1 ms of CPU, at a wave's starts).
    _dbworker_lend: Callable[[], Connection] | None = None

    def get_bind(
        self, mapper: Any = None, *, clause: Any = None, bind: Any = None, **kw: Any
    ) -> Engine | Connection:
        if self.bind is None and bind is None and self._dbworker_lend is not None:
            self.bind = self._dbworker_lend()
        return super().get_bind(mapper, clause=clause, bind=bind, **kw)

    def commit(self) -> None:
        if self._dbworker_guarded:
            self._dbworker_misuse = "the handler called session.commit()"
            raise HandlerContractError(
                "do not commit the session dbworker gives a handler: return Finished() or "
                "Unfinished() and dbworker commits your writes with the status change"
            )
        super().commit()

    def close(self) -> None:
        if self._dbworker_guarded:
            self._dbworker_misuse = "the handler called session.close()"
            raise HandlerContractError(
                "do not close the session dbworker gives a handler; dbworker closes it"
            )
        super().close()
