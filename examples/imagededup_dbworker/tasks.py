"""The dbworker side: a coordinator and two workers over the application's own tables.

There is no enqueue call anywhere: an ``Image`` row is the hash worker's work as soon
as it commits, and a sealed ``Collection`` becomes the compare worker's work once the
database says every one of its images is hashed.

Both services import this module (the API for ``has_execution_status`` and
``reset_failed``, the worker service to run the handlers), and so do the worker
processes, so it only defines things.
"""

from __future__ import annotations

from sqlalchemy import Select, create_engine, exists, select
from sqlalchemy.orm import Session, sessionmaker

from dbworker import Coordinator, ExecutionStatus, Finished, Outcome, Unfinished
from imagededup_shared import settings, work
from imagededup_shared.models import Collection, Image

DATABASE_URL = settings.database_url()
engine = create_engine(DATABASE_URL)
session_factory = sessionmaker(engine)
coordinator = Coordinator(
    session_factory,
    database_url=DATABASE_URL,
    # An interactive application: an upload after an idle spell should start hashing
    # within a second, not after the default 10 s back-off.
    max_poll_seconds=1.0,
)


@coordinator.transactional_worker(
    name="hash", source=Image, concurrency=settings.hash_concurrency()
)
def hash_image(image: Image, session: Session) -> Finished:
    # A corrupt file raises CorruptImage: dbworker rolls back, records the message and
    # marks the row FAILED, which keeps its collection's comparison waiting (below).
    work.hash_image(image)
    return Finished()


def compare_eligible() -> Select[Collection]:
    """Sealed collections none of whose images is still unhashed (or FAILED)."""
    unhashed = select(Image.id).where(
        Image.collection_id == Collection.id,
        ~coordinator.has_execution_status(
            worker="hash", source_id=Image.id, statuses=(ExecutionStatus.FINISHED,)
        ),
    )
    return (
        select(Collection)
        .where(Collection.sealed.is_(True), ~exists(unhashed))
        .order_by(Collection.id)
    )


@coordinator.transactional_worker(name="compare", source=Collection, eligible=compare_eligible)
def compare_collection(collection: Collection, session: Session) -> Outcome:
    # One page per invocation; its pairs and the new position commit together with
    # the Unfinished() status, so a killed invocation leaves neither behind.
    if work.compare_page(session, collection):
        return Finished()
    return Unfinished()
