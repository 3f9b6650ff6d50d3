"""Worker names become part of SQL identifiers, so they are checked strictly."""

from __future__ import annotations

import re

from .errors import ConfigurationError

NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]*")
TABLE_PREFIX = "dbworker_"
#: The longest identifier dbworker derives from a name is its status index.
LONGEST_SUFFIX = "_status_ix"
#: PostgreSQL's identifier limit (NAMEDATALEN - 1), the shortest of the built-in
#: databases' (MySQL/MariaDB: 64; SQLite: none). Names are held to it on every
#: database: an application developed on SQLite keeps its workers' names, and
#: their tables, when it moves to PostgreSQL or MySQL.
PORTABLE_IDENTIFIER_LENGTH = 63


def table_name(worker: str) -> str:
    return f"{TABLE_PREFIX}{worker}"


def validate_worker_name(name: object, max_identifier_length: int) -> str:
    if not isinstance(name, str):
        raise ConfigurationError(f"worker name must be a str, got {name!r}")
    if not NAME_PATTERN.fullmatch(name):
        raise ConfigurationError(
            f"invalid worker name {name!r}: it must start with a lowercase letter and "
            "contain only lowercase letters, digits and underscores"
        )
    return _check_length(name, max_identifier_length, "is too long for this database's identifiers")


def check_portable_length(name: str) -> str:
    """Refuse a name whose identifiers would not fit every built-in database."""
    return _check_length(
        name,
        PORTABLE_IDENTIFIER_LENGTH,
        "is too long",
        f", so that its tables fit PostgreSQL's {PORTABLE_IDENTIFIER_LENGTH}-character "
        "identifiers (the shortest limit of the built-in databases; names must work on "
        "every one, e.g. after moving from SQLite to PostgreSQL)",
    )


def _check_length(name: str, max_identifier_length: int, problem: str, why: str = "") -> str:
    if len(table_name(name)) + len(LONGEST_SUFFIX) > max_identifier_length:
        limit = max_identifier_length - len(TABLE_PREFIX) - len(LONGEST_SUFFIX)
        raise ConfigurationError(f"worker name {name!r} {problem}: at most {limit} characters{why}")
    return name
