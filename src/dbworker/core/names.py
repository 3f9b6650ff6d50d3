"""Worker names become part of SQL identifiers, so they are checked strictly."""

from __future__ import annotations

import re

from .errors import ConfigurationError

NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]*")
TABLE_PREFIX = "dbworker_"
#: The longest identifier dbworker derives from a name is its status index.
LONGEST_SUFFIX = "_status_ix"


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
    longest = len(table_name(name)) + len(LONGEST_SUFFIX)
    if longest > max_identifier_length:
        limit = max_identifier_length - len(TABLE_PREFIX) - len(LONGEST_SUFFIX)
        raise ConfigurationError(
            f"worker name {name!r} is too long for this database's identifiers: "
            f"at most {limit} characters"
        )
    return name
