"""The API service: ``uvicorn imagededup_celery.api:app``; the same routes as
``imagededup_dbworker.api``, but every change that should cause work enqueues it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from imagededup_shared.api import create_app
from imagededup_shared.models import Collection, Image, create_tables

from .tasks import engine, hash_image, session_factory, start_comparison


class CeleryJobs:
    def create_tables(self) -> None:
        create_tables(engine)

    def images_added(self, image_ids: Sequence[int]) -> None:
        for image_id in image_ids:
            hash_image.delay(image_id)

    def compare_requested(self, collection_id: int) -> None:
        start_comparison(collection_id)

    def image_status(self, session: Session, image: Image) -> tuple[str | None, str | None]:
        # Celery knows a task id, not an image: the application's columns say it all.
        if image.phash is not None:
            return "finished", None
        if image.hash_error is not None:
            return "failed", image.hash_error
        return None, None

    def progress(self, session: Session, collection: Collection) -> dict[str, Any]:
        def count(condition: Any) -> int:
            query = select(func.count()).where(Image.collection_id == collection.id, condition)
            return session.scalar(query) or 0

        return {
            "hashed": count(Image.phash.is_not(None)),
            "failed": count(Image.hash_error.is_not(None)),
            "compare": collection.compare_state,
        }

    def retry(self, session: Session, image: Image) -> bool:
        if image.hash_error is None:
            return False
        image.hash_error = None
        return True

    def after_retry(self, image: Image) -> None:
        # The chord that failed will not run its body: start the comparison over (its
        # hash tasks skip the images already done).
        with session_factory() as session:
            collection = session.get(Collection, image.collection_id)
            sealed = collection is not None and collection.sealed
        if sealed:
            start_comparison(image.collection_id)
        else:
            hash_image.delay(image.id)


app = create_app(CeleryJobs(), session_factory)
