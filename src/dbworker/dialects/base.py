"""The dialect boundary: everything dbworker asks of a database, in one class.

``Dialect`` assembles the shared SQL, written once with SQLAlchemy Core (claiming,
discovery, the fenced transitions, reading), over ``DialectInterface``, which declares
what each database provides and the capabilities it declares (``interface.py`` lists
both). A subclass overrides only where its database diverges, with a comment saying why.

Every method takes an open ``Connection`` inside a transaction the caller owns, so the
completion of a handler commits in the handler's own transaction.

The terms the parts share (``Claim``, ``Claims``, ``Owner``, ``claim_columns``,
``epoch_to_datetime``, ``PENDING_COLUMNS``, ``READ_ONLY_OPTION``) live in ``terms.py``
and are importable from here too.
"""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import Connection, select

from ..core.tasks import ErrorInfo
from ..core.transitions import Transition
from .claiming import Claiming
from .discovery import Discovery
from .fenced import FencedTransitions
from .many_rows import ManyRows
from .reading import CANCELLED_TYPE, Reading
from .terms import (
    NEVER_ISSUED_TOKEN,
    PENDING_COLUMNS,
    READ_ONLY_OPTION,
    Claim,
    Claims,
    Owner,
    WorkerTable,
    claim_columns,
    epoch_to_datetime,
)

__all__ = [
    "CANCELLED",
    "PENDING_COLUMNS",
    "READ_ONLY_OPTION",
    "Claim",
    "Claims",
    "Dialect",
    "Owner",
    "claim_columns",
    "epoch_to_datetime",
]

#: What a cancelled record's error fields hold (``dbworker.Cancelled``).
CANCELLED = ErrorInfo("Cancelled: the item was cancelled", CANCELLED_TYPE)


class Dialect(Claiming, Discovery, Reading, FencedTransitions, ManyRows):
    """Shared SQL for every database; subclasses override the divergent parts.

    A subclass must provide ``backend_names``, ``db_now`` and ``insert_ignore``, and may
    override the other methods ``DialectInterface`` lists and declare its flags.
    """

    #: The flags that vouch for a method as an ancestor wrote it, and those methods: a
    #: subclass that writes one of them again, and does not declare the flag itself,
    #: gets the flag switched off (the way such a class always behaved).
    _FLAGS_VOUCHING_FOR: ClassVar[dict[str, tuple[str, ...]]] = {
        "supports_one_statement_claims": ("lock_candidates",),
        "supports_discovery_watermark": ("discover",),
        "prepares_claim_in_discovery": (
            "discover",
            "discover_to_watermark",
            "_discover_above_watermark",
        ),
    }

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        for flag, methods in cls._FLAGS_VOUCHING_FOR.items():
            if flag not in own and any(method in own for method in methods):
                setattr(cls, flag, False)

    def cancel(self, conn: Connection, worker: WorkerTable, source_id: Any) -> bool:
        """Cancel ``source_id`` (the CANCEL row: FAILED with ``dbworker.Cancelled``) if
        its record is open; True if a record changed.

        An item not discovered yet gets its pending record first (insert-or-ignore, as
        discovery adds it), so that no discovery can make it pending later. A source id
        with no row gets no record. Racing a holder's finish, one guarded UPDATE of the
        same row each: whichever commits first wins, the other matches nothing.
        """
        if self.transition(
            conn, worker, Transition.CANCEL, source_id, NEVER_ISSUED_TOKEN, error=CANCELLED
        ):
            return True
        table = worker.table
        if conn.execute(select(table.c.source_id).where(table.c.source_id == source_id)).first():
            return False  # finished or failed already: nothing changes
        # A plain read of the source row (no lock on the application's row), then the
        # insert discovery would make.
        pk = worker.source_pk
        rows = conn.execute(select(pk, self.now()).where(pk == source_id)).all()
        if not self._add_pending(conn, worker, rows):
            return False
        return self.transition(
            conn, worker, Transition.CANCEL, source_id, NEVER_ISSUED_TOKEN, error=CANCELLED
        )
