"""The Celery side: tasks, a chord, and the state Celery leaves to the application.

Compared with ``imagededup_dbworker.tasks``: the API must enqueue (after its commit,
or a fast worker reads a row that is not there yet); the comparison starts from a
chord, which needs a result backend; the tasks must be idempotent, because the same
image is enqueued by the upload and by the chord, and a redelivered message runs
again; failures and progress are written to the application's own columns, because
Celery's result backend cannot be queried by collection.

Worker: ``celery -A imagededup_celery.tasks worker --concurrency 2``.
"""

from __future__ import annotations

import os

from celery import Celery, chord
from sqlalchemy import create_engine, select
from sqlalchemy.orm import sessionmaker

from imagededup_shared import imaging, settings, work
from imagededup_shared.models import Collection, Image

REDIS_URL = os.environ.get("IMAGEDEDUP_REDIS_URL", "redis://127.0.0.1:6379/0")

engine = create_engine(settings.database_url())
session_factory = sessionmaker(engine)

# A chord counts its finished header tasks in the result backend: without one, no chord.
app = Celery("imagededup", broker=REDIS_URL, backend=REDIS_URL)
app.conf.update(
    task_default_queue=os.environ.get("IMAGEDEDUP_CELERY_QUEUE", "imagededup"),
    # What Celery's documentation advises for tasks that must survive a worker crash:
    # acknowledge after the task ran, and redeliver it if its process died. The tasks
    # below are idempotent, as that requires.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    result_expires=3600,
    broker_connection_retry_on_startup=True,
)


@app.task(name="imagededup.hash_image")  # type: ignore[untyped-decorator]  # Celery is untyped
def hash_image(image_id: int) -> None:
    with session_factory.begin() as session:
        image = session.get(Image, image_id)
        if image is None or image.phash is not None:
            return  # enqueued twice (upload and chord), or redelivered: already done
        try:
            work.hash_image(image)
            return
        except imaging.CorruptImage as exc:
            error = str(exc)
    # The failed transaction wrote nothing; the error goes in its own one.
    with session_factory.begin() as session:
        failed = session.get(Image, image_id)
        if failed is not None:
            failed.hash_error = error
    raise imaging.CorruptImage(error)  # fails the chord: the comparison does not start


@app.task(name="imagededup.compare_page")  # type: ignore[untyped-decorator]
def compare_page(collection_id: int) -> None:
    with session_factory.begin() as session:
        collection = session.get(Collection, collection_id)
        if collection is None or collection.compare_state == "finished":
            return
        collection.compare_state = "comparing"
        done = work.compare_page(session, collection)
        if done:
            collection.compare_state = "finished"
    if not done:
        # The next page, enqueued after the commit so that it reads the new position.
        # A process killed between the commit and this call loses the continuation:
        # nothing in Celery would notice (dbworker's Unfinished() commits with the page).
        compare_page.delay(collection_id)


def start_comparison(collection_id: int) -> None:
    """Hash every image of the collection (a no-op for those done), then compare."""
    with session_factory.begin() as session:
        ids = list(session.scalars(select(Image.id).where(Image.collection_id == collection_id)))
        collection = session.get(Collection, collection_id)
        if collection is not None:
            collection.compare_state = "waiting"
    chord(hash_image.si(image_id) for image_id in ids)(compare_page.si(collection_id))
