"""Fixtures of the flow tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .support import Harness, harness


@pytest.fixture
def h(database_url: str, tmp_path: Path) -> Iterator[Harness]:
    """The flow application's tables in an empty database, torn down after the test."""
    with harness(database_url, tmp_path) as value:
        yield value
