"""Fixtures of the executor suite."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import app
from .support import Rig, open_engine

# Before any coordinator starts the fork server, which inherits the environment.
os.environ[app.IMPORTER_PID_ENV] = str(os.getpid())


@pytest.fixture
def rig(database_url: str, tmp_path: Path) -> Iterator[Rig]:
    """The suite's tables in an empty database; every coordinator stopped at teardown
    (what still runs is killed: a failing test must not leave handlers behind)."""
    engine = open_engine(database_url)
    workdir = tmp_path / "work"
    workdir.mkdir()
    app.Base.metadata.create_all(
        engine, tables=[app.Base.metadata.tables[m.__tablename__] for m in (app.Item, app.Effect)]
    )
    value = Rig(database_url, engine, workdir)
    try:
        yield value
    finally:
        value.stop_all()
        engine.dispose()
