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

from .claiming import Claiming
from .discovery import Discovery
from .fenced import FencedTransitions
from .reading import Reading
from .terms import (
    PENDING_COLUMNS,
    READ_ONLY_OPTION,
    Claim,
    Claims,
    Owner,
    claim_columns,
    epoch_to_datetime,
)

__all__ = [
    "PENDING_COLUMNS",
    "READ_ONLY_OPTION",
    "Claim",
    "Claims",
    "Dialect",
    "Owner",
    "claim_columns",
    "epoch_to_datetime",
]


class Dialect(Claiming, Discovery, Reading, FencedTransitions):
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
    }

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        for flag, methods in cls._FLAGS_VOUCHING_FOR.items():
            if flag not in own and any(method in own for method in methods):
                setattr(cls, flag, False)
