"""Which dialect serves which database, and how third parties add one.

Built-in dialects are looked up by SQLAlchemy backend name. A package adds a
database by exposing a ``Dialect`` subclass in the ``dbworker.dialects``
entry-point group (the entry point's name is the backend name), or by calling
``register()`` at import time, and proves it with the conformance kit
(``dbworker.testing.exercise``).
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from sqlalchemy import Engine
from sqlalchemy.engine import URL, make_url

from ..core.errors import ConfigurationError
from .base import Dialect
from .terms import Clock

ENTRY_POINT_GROUP = "dbworker.dialects"

_BUILTIN: dict[str, str] = {
    "postgresql": "dbworker.dialects.postgresql:PostgreSQLDialect",
    "mysql": "dbworker.dialects.mysql:MySQLDialect",
    "mariadb": "dbworker.dialects.mysql:MySQLDialect",
    "sqlite": "dbworker.dialects.sqlite:SQLiteDialect",
}
_registered: dict[str, type[Dialect]] = {}


def register(backend_name: str, dialect: type[Dialect]) -> None:
    """Serve ``backend_name`` (as in ``URL.get_backend_name()``) with ``dialect``."""
    if not (isinstance(dialect, type) and issubclass(dialect, Dialect)):
        raise ConfigurationError(f"{dialect!r} is not a dbworker Dialect subclass")
    _registered[backend_name] = dialect


def _load(reference: str) -> type[Dialect]:
    module_name, _, attribute = reference.partition(":")
    loaded = getattr(importlib.import_module(module_name), attribute)
    if not (isinstance(loaded, type) and issubclass(loaded, Dialect)):
        raise ConfigurationError(f"{reference} is not a dbworker Dialect subclass")
    return loaded


def dialect_class(backend_name: str) -> type[Dialect]:
    if backend_name in _registered:
        return _registered[backend_name]
    for entry in entry_points(group=ENTRY_POINT_GROUP, name=backend_name):
        register(backend_name, _load(entry.value))
        return _registered[backend_name]
    if backend_name in _BUILTIN:
        register(backend_name, _load(_BUILTIN[backend_name]))
        return _registered[backend_name]
    raise ConfigurationError(
        f"dbworker has no dialect for the {backend_name!r} database; supported: "
        f"{', '.join(sorted(set(_BUILTIN) | set(_registered)))}"
    )


def for_url(url: str | URL, clock: Clock | None = None) -> Dialect:
    return dialect_class(make_url(url).get_backend_name())(clock)


def for_engine(engine: Engine, clock: Clock | None = None) -> Dialect:
    return dialect_class(engine.url.get_backend_name())(clock)
