"""Fixtures of the crash suite."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from dbworker import Coordinator

from .support import make_coordinator, open_dbworker_engine, open_engine


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """The application's engine: the coordinators' session factory, and test reads."""
    engine = open_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def dbworker_engine(database_url: str) -> Iterator[Engine]:
    """For tests that drive a dialect directly (claims, takeovers)."""
    engine = open_dbworker_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


CoordinatorFactory = Callable[..., Coordinator]


@pytest.fixture
def coordinators(engine: Engine, database_url: str) -> Iterator[CoordinatorFactory]:
    """Build in-process coordinators of the crash worker; all are stopped at teardown."""
    made: list[Coordinator] = []

    def build(
        *, lease_seconds: float, concurrency: int, executor: str | None = None
    ) -> Coordinator:
        coordinator = make_coordinator(
            engine,
            database_url,
            lease_seconds=lease_seconds,
            concurrency=concurrency,
            executor=executor,
        )
        made.append(coordinator)
        return coordinator

    yield build
    for coordinator in made:
        # Kill whatever still runs: a failed test must not leave handlers blocked.
        coordinator.stop(timeout=0)
