"""examples/imagededup_celery end to end against the local Redis, on SQLite: the same
scenario as the dbworker example's (a damaged image repaired and retried)."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

from imagededup_shared import samples

from .flow import MAX_UPLOAD_BYTES, run_flow
from .services import Process, api_service, example_env

REDIS_URL = os.environ.get("IMAGEDEDUP_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
def redis_url() -> str:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        # CI starts Redis with the databases (./dev services) and requires them all.
        if os.environ.get("DBWORKER_REQUIRE_BACKENDS"):
            pytest.fail(f"Redis at {REDIS_URL} is required but unavailable: {exc}")
        pytest.skip(f"Redis at {REDIS_URL} unavailable: {exc}")
    return REDIS_URL


@pytest.mark.backends("sqlite")
def test_deduplicates_through_the_api(
    backend: str,
    database_url: str,
    redis_url: str,
    tmp_path: Path,
    sample_set: samples.SampleSet,
) -> None:
    env = example_env(
        IMAGEDEDUP_DATABASE_URL=database_url,
        IMAGEDEDUP_MEDIA=str(tmp_path / "media"),
        IMAGEDEDUP_MAX_UPLOAD_BYTES=str(MAX_UPLOAD_BYTES),
        IMAGEDEDUP_REDIS_URL=redis_url,
        # A queue of this test's own: other tests and benchmarks share the Redis.
        IMAGEDEDUP_CELERY_QUEUE=f"imagededup-test-{uuid.uuid4().hex}",
    )
    argv = [sys.executable, "-m", "celery", "-A", "imagededup_celery.tasks", "worker"]
    argv += ["--concurrency", "2", "--loglevel", "INFO", "--without-gossip", "--without-mingle"]

    def start_worker() -> Process:
        return Process(argv, env, tmp_path / "worker.log")

    with api_service("imagededup_celery.api:app", env, tmp_path / "api.log") as client:
        run_flow(client, tmp_path, sample_set, start_worker)
