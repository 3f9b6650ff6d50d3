"""The application's tables, the same for both examples.

The few columns marked "Celery twin" hold what dbworker keeps in its own execution
records (whether hashing failed, and why; where comparison stands): with Celery the
application has to keep that state itself, because Celery's result backend cannot be
queried by collection.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    DateTime,
    Engine,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Collection(Base):
    """A set of images to deduplicate. Comparison starts once it is sealed."""

    __tablename__ = "dedup_collections"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    # Sealed: no more images; the comparison may start once every image is hashed.
    sealed: Mapped[bool] = mapped_column(default=False)
    # Largest perceptual-hash Hamming distance (of 64 bits) still called a duplicate.
    threshold: Mapped[int] = mapped_column(Integer, default=10)
    # Images whose pairs one comparison invocation covers.
    page_size: Mapped[int] = mapped_column(Integer, default=100)
    # The comparison's position, kept in the application's own columns: every pair
    # (a, b) with a <= compared_through has been compared and its duplicates written.
    compared_through: Mapped[int] = mapped_column(Integer, default=0)
    pages_done: Mapped[int] = mapped_column(Integer, default=0)
    pairs_compared: Mapped[int] = mapped_column(BigInteger, default=0)
    groups_found: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime, server_default=func.now())
    # Celery twin: None, "waiting" (for hashes), "comparing", "finished".
    compare_state: Mapped[str | None] = mapped_column(String(20))


class Image(Base):
    """One uploaded or registered image and, once hashed, its artifact."""

    __tablename__ = "dedup_images"
    __table_args__ = (Index("ix_dedup_images_collection", "collection_id", "id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    collection_id: Mapped[int] = mapped_column(ForeignKey("dedup_collections.id"))
    filename: Mapped[str] = mapped_column(String(255))
    # Uploads are stored under the media root; registered directories are read in place.
    path: Mapped[str] = mapped_column(String(1000))
    size_bytes: Mapped[int] = mapped_column(Integer)
    format: Mapped[str] = mapped_column(String(20))
    width: Mapped[int | None] = mapped_column(Integer)
    height: Mapped[int | None] = mapped_column(Integer)
    # The artifact: perceptual and difference hashes (64 bits, hex) and a thumbnail.
    phash: Mapped[str | None] = mapped_column(String(16))
    dhash: Mapped[str | None] = mapped_column(String(16))
    thumbnail: Mapped[str | None] = mapped_column(String(1000))
    # Committed hash runs: more than 1 means the work was repeated (the benchmark
    # counts these after killing a worker process).
    hash_runs: Mapped[int] = mapped_column(Integer, default=0)
    # Celery twin: the last hashing error.
    hash_error: Mapped[str | None] = mapped_column(Text)


class DuplicatePair(Base):
    """Two images of a collection within the threshold; written page by page."""

    __tablename__ = "dedup_pairs"
    # A page written twice (a Celery task redelivered after it committed) cannot
    # duplicate pairs; with dbworker the page and the position commit together.
    __table_args__ = (UniqueConstraint("collection_id", "image_a", "image_b"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    collection_id: Mapped[int] = mapped_column(ForeignKey("dedup_collections.id"))
    image_a: Mapped[int] = mapped_column(ForeignKey("dedup_images.id"))
    image_b: Mapped[int] = mapped_column(ForeignKey("dedup_images.id"))
    distance: Mapped[int] = mapped_column(Integer)


class DuplicateGroup(Base):
    """Images connected by duplicate pairs, written when the comparison finishes."""

    __tablename__ = "dedup_groups"

    id: Mapped[int] = mapped_column(primary_key=True)
    collection_id: Mapped[int] = mapped_column(ForeignKey("dedup_collections.id"), index=True)
    size: Mapped[int] = mapped_column(Integer)


class GroupMember(Base):
    __tablename__ = "dedup_group_members"

    group_id: Mapped[int] = mapped_column(ForeignKey("dedup_groups.id"), primary_key=True)
    image_id: Mapped[int] = mapped_column(ForeignKey("dedup_images.id"), primary_key=True)


def create_tables(engine: Engine) -> None:
    """``create_all``, safe when both services start at once: the loser of the race
    between "does it exist?" and CREATE TABLE tries again and then sees the tables."""
    try:
        Base.metadata.create_all(engine)
    except DBAPIError:
        Base.metadata.create_all(engine)
