"""An application with periodic workers, as the ``dbworker`` command sees it:
``operations.schedules_cli_app:coordinator`` (the database URL from the environment,
as ``cli_app``'s)."""

from __future__ import annotations

import os

from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

from dbworker import Coordinator

from . import periodic_app

URL_ENV = "DBWORKER_OPS_URL"

coordinator = Coordinator(
    sessionmaker(create_engine(os.environ[URL_ENV])), database_url=os.environ[URL_ENV]
)
periodic_app.register(coordinator)
