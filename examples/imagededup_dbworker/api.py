"""The API service: ``uvicorn imagededup_dbworker.api:app``.

It never tells the worker anything: committing a row is all it takes. Progress and
failures are read from dbworker's execution records, in the same queries as the
application's rows (``has_execution_status``), and a retry is ``reset_failed``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from dbworker import ExecutionStatus
from imagededup_shared.api import create_app
from imagededup_shared.models import Collection, Image, create_tables

from .tasks import coordinator, engine, session_factory


class DbworkerJobs:
    def create_tables(self) -> None:
        # The execution tables live in the models' MetaData, so this creates them too.
        create_tables(engine)

    def images_added(self, image_ids: Sequence[int]) -> None:
        pass  # committed rows are the hash worker's work: there is nothing to enqueue

    def compare_requested(self, collection_id: int) -> None:
        pass  # sealing made the collection eligible for "compare" once all are hashed

    def image_status(self, session: Session, image: Image) -> tuple[str | None, str | None]:
        state = coordinator.workers["hash"].state(session, image.id)
        if state is None:
            return None, None
        return state["execution_status"].value, state["error"]

    def progress(self, session: Session, collection: Collection) -> dict[str, Any]:
        def count(status: ExecutionStatus) -> int:
            condition = coordinator.has_execution_status(
                worker="hash", source_id=Image.id, statuses=(status,)
            )
            query = select(func.count()).where(Image.collection_id == collection.id, condition)
            return session.scalar(query) or 0

        compare = coordinator.execution_status(session, worker="compare", source_id=collection.id)
        return {
            "hashed": count(ExecutionStatus.FINISHED),
            "failed": count(ExecutionStatus.FAILED),
            "compare": compare.value if compare is not None else None,
        }

    def retry(self, session: Session, image: Image) -> bool:
        return coordinator.workers["hash"].reset_failed(session, image.id)

    def after_retry(self, image: Image) -> None:
        pass  # the running coordinator claims the reset row again by itself


app = create_app(DbworkerJobs(), session_factory)
