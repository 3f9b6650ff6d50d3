"""The session a handler receives."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

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
