"""The coordinator's own engine, apart from the application's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL

from .dialects import Dialect


def coordination_engine(url: URL, dialect: Dialect, options: Mapping[str, Any]) -> Engine:
    """The engine scheduling runs on: the dialect's coordinator options under the
    user's ``engine_options``, set up by the dialect. Its own pool, so a busy
    application pool can never starve lease renewals."""
    defaults = dict(dialect.coordinator_engine_options())  # the dialect's own stays as it was
    if "poolclass" not in options and "pool" not in options:
        # The scheduler runs one transaction after another: the connection it gave back
        # last serves the next. In turn (the pool's default order) its transactions
        # went to each pooled connection's server process in rotation (two, once a
        # rate limit made its slots on a second one), whose caches were cold for
        # them: a PostgreSQL claim of 32 with its finishes took 23 ms instead of 19.
        defaults["pool_use_lifo"] = True
    engine = create_engine(url, **{**defaults, **options})
    dialect.configure_engine(engine)
    return engine
