"""What a claim sets, from the CLAIM and TAKEOVER rows of the transition table.

One UPDATE claims a batch that may mix pending or due records (CLAIM) with working
records whose lease expired (TAKEOVER). Where the two rows set a field differently (a
takeover counts the vanished holder's crash), the value is chosen by the record's
status as the claim found it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, String, Table, bindparam, case, null

from ..core.status import Phase
from ..core.transitions import (
    INCREMENT,
    KEY,
    LATER,
    NOW,
    NULL,
    OWNER,
    ROWS,
    ZERO,
    Transition,
    Value,
)
from .terms import status_literal

#: The parameter a claim of an ``exclusive_by`` worker binds each record's key to.
KEY_PARAM = "dbworker_key"


def claim_values(
    table: Table, now: ColumnElement[float], lease_seconds: float, owner: tuple[str, int]
) -> list[tuple[ColumnElement[Any], Any]]:
    """The SET clause of a claim, in order: the fields a takeover sets differently
    first (MySQL evaluates SET left to right with already-updated values, so they must
    read ``status`` before it is overwritten), then ``status``, the shared fields, and
    ``updated_at``. ``owner`` is the claiming coordinator's (host, pid)."""
    claim, takeover = ROWS[Transition.CLAIM], ROWS[Transition.TAKEOVER]
    taking_over = table.c.status == status_literal(Phase.WORKING)

    def sql(name: str, value: Value | None) -> Any:
        column = table.c[name]
        if value is None:  # the row leaves the field alone
            return column
        if value is INCREMENT:
            return column + 1
        if value is LATER:
            return now + lease_seconds
        if value is NOW:
            return now
        if value is NULL:
            return null()
        if value is ZERO:
            return 0
        if value is OWNER:
            return owner[0] if name == "owner_host" else owner[1]
        if value is KEY:
            # Per record: a claim of an exclusive_by worker runs one row per key
            # (dialects/limited.py); any other claim of such a table fails loudly.
            return bindparam(KEY_PARAM, type_=String())
        raise ValueError(f"a claim cannot set {name} to {value.name}")

    # A field the table lacks (``held_key``, which only exclusive_by workers have) is
    # left out: other workers' claims run exactly the statement they always ran.
    names = [n for n in dict.fromkeys([*takeover.sets, *claim.sets]) if n in table.c]
    differing = [n for n in names if claim.sets.get(n) is not takeover.sets.get(n)]
    values: list[tuple[ColumnElement[Any], Any]] = [
        (
            table.c[name],
            case(
                (taking_over, sql(name, takeover.sets.get(name))),
                else_=sql(name, claim.sets.get(name)),
            ),
        )
        for name in differing
    ]
    values.append((table.c.status, Phase.WORKING.value))
    values += [(table.c[n], sql(n, claim.sets[n])) for n in names if n not in differing]
    values.append((table.c.updated_at, now))
    return values
