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
    engine = create_engine(url, **{**dialect.coordinator_engine_options(), **options})
    dialect.configure_engine(engine)
    return engine
