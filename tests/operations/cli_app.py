"""The application as the ``dbworker`` command sees it: ``operations.cli_app:coordinator``.

The database URL comes from the environment (``DBWORKER_OPS_URL``), as a real
deployment's would. Two workers over the same jobs: ``jobs`` runs every job,
``quick`` only QUICK ones.
"""

from __future__ import annotations

import os

from sqlalchemy import create_engine, select
from sqlalchemy.orm import sessionmaker

from dbworker import Coordinator

from . import app

URL_ENV = "DBWORKER_OPS_URL"

engine = create_engine(os.environ[URL_ENV])
coordinator = Coordinator(
    sessionmaker(engine),
    database_url=os.environ[URL_ENV],
    # Quick polls keep the tests short; they do not change what is tested.
    poll_seconds=0.05,
    max_poll_seconds=0.5,
)
coordinator.transactional_worker(name="jobs", source=app.Job, concurrency=2)(app.run_job)
coordinator.transactional_worker(
    name="quick",
    source=app.Job,
    eligible=lambda: select(app.Job).where(app.Job.mode == app.QUICK).order_by(app.Job.id),
)(app.run_job)

#: Not a coordinator, for the error message test.
not_a_coordinator = engine
