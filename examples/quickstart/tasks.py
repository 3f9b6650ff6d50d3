"""The application side of the quick start: a model, a coordinator and two handlers.

Worker processes import this module to find the handlers, so everything here is
at module scope and importing it has no side effects beyond defining things.
"""

from __future__ import annotations

import os

from sqlalchemy import String, create_engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from dbworker import Coordinator, ExecutionStatus, Finished, Outcome, Unfinished

DATABASE_URL = os.environ.get("DATABASE_URL", "sqlite:///quickstart.sqlite")

engine = create_engine(DATABASE_URL)
session_factory = sessionmaker(engine)
coordinator = Coordinator(session_factory, database_url=DATABASE_URL)


class Base(DeclarativeBase):
    pass


class Upload(Base):
    __tablename__ = "uploads"

    id: Mapped[int] = mapped_column(primary_key=True)
    filename: Mapped[str] = mapped_column(String(200))
    approved: Mapped[bool] = mapped_column(default=False)
    pages_done: Mapped[int] = mapped_column(default=0)
    pages: Mapped[int] = mapped_column(default=3)
    thumbnail: Mapped[str | None] = mapped_column(String(200))


@coordinator.transactional_worker(
    name="render",
    source=Upload,
    # Only approved uploads, oldest first. Finished, failed and claimed rows are
    # left out by dbworker itself.
    eligible=lambda: select(Upload).where(Upload.approved.is_(True)).order_by(Upload.id),
    concurrency=2,
)
def render(upload: Upload, session: Session) -> Outcome:
    # One page per invocation; the position is kept in the row itself.
    upload.pages_done += 1
    if upload.pages_done < upload.pages:
        return Unfinished()
    return Finished()


@coordinator.transactional_worker(
    name="thumbnail",
    source=Upload,
    eligible=lambda: select(Upload).where(
        coordinator.has_execution_status(
            worker="render", source_id=Upload.id, statuses=(ExecutionStatus.FINISHED,)
        )
    ),
)
def make_thumbnail(upload: Upload, session: Session) -> Finished:
    upload.thumbnail = f"thumbs/{upload.filename}.png"
    return Finished()
