"""examples/imagededup_dbworker end to end on every database: uvicorn serving the API,
the worker service as a real process (``python -m`` on SQLite and PostgreSQL,
``dbworker run`` on MariaDB), a damaged image repaired and retried."""

from __future__ import annotations

import sys
from pathlib import Path

from imagededup_shared import samples

from .flow import MAX_UPLOAD_BYTES, run_flow
from .services import Process, api_service, example_env

DBWORKER = str(Path(sys.executable).with_name("dbworker"))


def test_deduplicates_through_the_api(
    backend: str, database_url: str, tmp_path: Path, sample_set: samples.SampleSet
) -> None:
    env = example_env(
        IMAGEDEDUP_DATABASE_URL=database_url,
        IMAGEDEDUP_MEDIA=str(tmp_path / "media"),
        IMAGEDEDUP_MAX_UPLOAD_BYTES=str(MAX_UPLOAD_BYTES),
    )
    if backend == "mysql":
        worker_argv = [DBWORKER, "run", "imagededup_dbworker.tasks:coordinator", "--create-tables"]
    else:
        worker_argv = [sys.executable, "-m", "imagededup_dbworker.worker"]

    def start_worker() -> Process:
        return Process(worker_argv, env, tmp_path / "worker.log")

    with api_service("imagededup_dbworker.api:app", env, tmp_path / "api.log") as client:
        run_flow(client, tmp_path, sample_set, start_worker)
