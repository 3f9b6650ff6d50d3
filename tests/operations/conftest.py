"""Fixtures of the operations suite."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends import REQUIRE_ENV_VAR, required_backends

from .servers import PrivateServer, ServerUnavailable, start_private_server
from .support import Site, site


@pytest.fixture
def private_server(backend: str) -> Iterator[PrivateServer]:
    """A server of the test's backend that only this test uses, so it may be stopped,
    killed and restarted; empty database ``ops`` at ``.url``. Skipped (or failed, when
    DBWORKER_REQUIRE_BACKENDS lists the backend) if the server programs are missing."""
    if backend not in ("postgresql", "mysql"):
        pytest.fail(
            'private_server needs @pytest.mark.backends("postgresql", "mysql")', pytrace=False
        )
    try:
        server = start_private_server(backend)
    except ServerUnavailable as exc:
        reason = str(exc)
    else:
        try:
            yield server
        finally:
            server.destroy()
        return
    if backend in required_backends():
        pytest.fail(
            f"{backend} is required ({REQUIRE_ENV_VAR}={os.environ[REQUIRE_ENV_VAR]}) but a "
            f"private server cannot be started: {reason}",
            pytrace=False,
        )
    pytest.skip(f"private {backend} server unavailable: {reason}")


@pytest.fixture
def ops(database_url: str, tmp_path: Path) -> Iterator[Site]:
    """The application's tables in the test's empty database, and a work directory."""
    with site(database_url, tmp_path / "work") as value:
        yield value
