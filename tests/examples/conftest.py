"""Fixtures of the examples' tests: a small planted image set."""

from __future__ import annotations

import pytest

from imagededup_shared import samples


@pytest.fixture(scope="session")
def sample_set(tmp_path_factory: pytest.TempPathFactory) -> samples.SampleSet:
    """Three planted scene groups, two real photographs with variants, three singles."""
    return samples.generate(
        tmp_path_factory.mktemp("samples"), groups=3, singles=3, seed=14, photographs=2
    )
