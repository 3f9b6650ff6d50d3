"""``exclusive_by``, ``rate_limit`` and ``rate_limit_by``, checked at registration and
made into the dialect's ``Limits`` (issue 26; the claim is ``dialects/limited.py``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, Table
from sqlalchemy.sql import ClauseElement, coercions, roles

from .core.errors import ConfigurationError
from .core.limits import parse_rate
from .dialects import Limits
from .schema import rate_slots_table


def _shown(value: object) -> str:
    """How a message names ``value``: ``Doc.owner`` for a mapped attribute, else repr."""
    if isinstance(value, ClauseElement) or hasattr(value, "__clause_element__"):
        return str(value)
    return repr(value)


def key_expression(option: str, value: object, source: Table) -> ColumnElement[Any]:
    """``value`` (a column or SQL expression) as SQL, refused unless it reads the
    source's table and no other."""
    try:
        expression: ColumnElement[Any] = coercions.expect(roles.ExpressionElementRole, value)
    except Exception as exc:  # SQLAlchemy's ArgumentError, or anything coercion raised
        raise ConfigurationError(
            f"{option} must be a column or SQL expression of {source.name}, got {_shown(value)}"
        ) from exc
    tables = set(expression._from_objects)
    if tables != {source}:
        names = ", ".join(sorted(getattr(t, "name", str(t)) for t in tables)) or "no table"
        raise ConfigurationError(
            f"{option}={_shown(value)} must be an expression of the source's table {source.name}, "
            f"but it reads {names}"
        )
    return expression


def check_limits(
    source: Table,
    exclusive_by: object = None,
    rate_limit: object = None,
    rate_limit_by: object = None,
) -> Limits | None:
    """The limits a registration asks for (None: none), or ConfigurationError naming
    the value at fault."""
    if exclusive_by is None and rate_limit is None and rate_limit_by is None:
        return None
    exclusive = (
        None if exclusive_by is None else key_expression("exclusive_by", exclusive_by, source)
    )
    if rate_limit is None and rate_limit_by is not None:
        raise ConfigurationError(
            f'rate_limit_by={_shown(rate_limit_by)} needs a rate_limit (e.g. rate_limit="5/s")'
        )
    rate = None if rate_limit is None else parse_rate(rate_limit)
    rate_key = None
    if rate_limit_by is not None:
        rate_key = key_expression("rate_limit_by", rate_limit_by, source)
    slots = None if rate is None else rate_slots_table(source.metadata)
    return Limits(exclusive, rate, rate_key, slots)
