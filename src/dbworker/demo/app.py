"""The demo's application: its tables, its two handlers and the coordinator's wiring.

A module of its own, importable as ``dbworker.demo.app``: the worker processes
import it to find the handlers and the model.
"""

from __future__ import annotations

import random
import time

from sqlalchemy import (
    ForeignKey,
    Select,
    String,
    Text,
    select,
)
from sqlalchemy.engine import URL
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from dbworker import Coordinator, ExecutionStatus, Finished, Outcome, Unfinished

#: Simulated cost of reading one paragraph. The handler holds no transaction meanwhile.
STEP_SECONDS = 0.1
#: What a paragraph that the summarizer cannot read looks like.
UNREADABLE = "[page missing]"
PUBLISH_CONCURRENCY = 2

# --- The application ------------------------------------------------------------------


class Base(DeclarativeBase):
    pass


class Document(Base):
    __tablename__ = "documents"

    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str] = mapped_column(String(200))
    body: Mapped[str] = mapped_column(Text)
    # The summarizer's position lives in the application's row: each invocation
    # starts the handler from the top, and this says where the work stands.
    paragraphs_read: Mapped[int] = mapped_column(default=0)
    words: Mapped[int] = mapped_column(default=0)
    notes: Mapped[str] = mapped_column(Text, default="")
    summary: Mapped[str | None] = mapped_column(Text)


class Publication(Base):
    __tablename__ = "publications"

    id: Mapped[int] = mapped_column(primary_key=True)
    # Unique: a second publication of one document would fail loudly, so the final
    # check that every document has exactly one row is meaningful.
    document_id: Mapped[int] = mapped_column(ForeignKey("documents.id"), unique=True)
    slug: Mapped[str] = mapped_column(String(250))
    blurb: Mapped[str] = mapped_column(Text)


def paragraphs(body: str) -> list[str]:
    return body.split("\n\n")


def read_paragraph(paragraph: str) -> int:
    """The slow part of summarizing: returns the paragraph's word count."""
    time.sleep(STEP_SECONDS)
    if UNREADABLE in paragraph:
        raise ValueError(f"cannot read paragraph {paragraph!r}")
    return len(paragraph.split())


# --- Handlers: run in worker processes --------------------------------------------------


def summarize(document: Document, session: Session) -> Outcome:
    """Read one more paragraph of ``document``; Finished after the last one."""
    document_id, position = document.id, document.paragraphs_read
    parts = paragraphs(document.body)
    # On SQLite the handler's transaction holds the database's only write lock from
    # its first statement: end it before the slow part (values were copied above).
    session.rollback()
    words = read_paragraph(parts[position])
    # A new transaction: the writes below commit together with the status change.
    document = session.get_one(Document, document_id)
    document.paragraphs_read = position + 1
    document.words += words
    document.notes += parts[position].split(". ")[0].rstrip(".") + ". "
    if document.paragraphs_read < len(parts):
        return Unfinished()
    document.summary = f"{document.notes.strip()} ({document.words} words)"
    return Finished()


def publish(document: Document, session: Session) -> Finished:
    slug = "-".join(document.title.lower().split())
    session.add(Publication(document_id=document.id, slug=slug, blurb=document.summary or ""))
    return Finished()


# --- Wiring -------------------------------------------------------------------------------


def build_coordinator(
    session_factory: sessionmaker[Session], url: URL, concurrency: int
) -> Coordinator:
    # Short polls keep a demo of a few seconds lively; the defaults suit a service.
    coordinator = Coordinator(
        session_factory, database_url=url, poll_seconds=0.1, max_poll_seconds=0.5
    )
    coordinator.transactional_worker(
        name="summarize",
        source=Document,
        eligible=lambda: select(Document).order_by(Document.id),
        concurrency=concurrency,
    )(summarize)

    def publishable() -> Select[Document]:
        summarized = coordinator.has_execution_status(
            worker="summarize", source_id=Document.id, statuses=(ExecutionStatus.FINISHED,)
        )
        return select(Document).where(summarized).order_by(Document.id)

    coordinator.transactional_worker(
        name="publish", source=Document, eligible=publishable, concurrency=PUBLISH_CONCURRENCY
    )(publish)
    return coordinator


TOPICS = (
    "river ecology",
    "sourdough",
    "tidal power",
    "bicycle repair",
    "moss gardens",
    "lighthouse keeping",
    "paper maps",
    "beekeeping",
    "night trains",
    "glass blowing",
)
SENTENCES = (
    "It has a long history",
    "Most of the practical details are easy to get wrong",
    "A few careful measurements settle the common arguments",
    "Beginners usually overestimate the equipment they need",
    "The best results come from patience rather than speed",
    "Local knowledge matters more than any manual",
)


def make_documents(count: int, broken: int, rng: random.Random) -> list[Document]:
    """``count`` documents of one to four paragraphs; document number ``broken`` has an
    unreadable second paragraph."""
    documents = []
    for number in range(1, count + 1):
        topic = TOPICS[(number - 1) % len(TOPICS)]
        parts = [
            ". ".join([f"On {topic}, part {p}", *rng.sample(SENTENCES, 3)]) + "."
            for p in range(1, rng.randint(1, 4) + 1)
        ]
        if number == broken:
            parts = [parts[0], f"{UNREADABLE} Scanning failed here.", *parts[1:]]
        title = f"Notes on {topic} {number}"
        documents.append(Document(id=number, title=title, body="\n\n".join(parts)))
    return documents


def repaired(body: str) -> str:
    return "\n\n".join(
        "This page was rescanned. It reads fine now." if UNREADABLE in part else part
        for part in paragraphs(body)
    )
