"""Run the quick start: ``python examples/quickstart/main.py`` (SQLite file in the
current directory), or set DATABASE_URL to a PostgreSQL or MySQL database."""

from __future__ import annotations

import time

from sqlalchemy import func, select
from tasks import Base, Upload, coordinator, engine, session_factory

from dbworker import ExecutionStatus


def waiting() -> int:
    """Uploads whose thumbnail is not FINISHED yet, counted by the database."""
    done = coordinator.has_execution_status(
        worker="thumbnail", source_id=Upload.id, statuses=(ExecutionStatus.FINISHED,)
    )
    with session_factory() as session:
        return session.scalar(select(func.count()).select_from(Upload).where(~done)) or 0


def main() -> None:
    Base.metadata.create_all(engine, tables=[Base.metadata.tables["uploads"]])
    coordinator.create_worker_tables()
    with session_factory.begin() as session:
        session.add_all(Upload(filename=f"scan-{n}", approved=n % 2 == 0) for n in range(6))

    coordinator.start()
    try:
        # Approving the rest later is all it takes to make them work: no enqueue call.
        with session_factory.begin() as session:
            for upload in session.scalars(select(Upload).where(Upload.approved.is_(False))):
                upload.approved = True
        deadline = time.monotonic() + 60
        while waiting() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        coordinator.stop()

    with session_factory() as session:
        for upload in session.scalars(select(Upload).order_by(Upload.id)):
            status = coordinator.execution_status(session, worker="thumbnail", source_id=upload.id)
            print(upload.id, upload.filename, upload.pages_done, upload.thumbnail, status)


if __name__ == "__main__":
    main()
