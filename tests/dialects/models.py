"""Application models the conformance checks run against, with their own metadata."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ForeignKey, Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from dbworker import Finished


class Base(DeclarativeBase):
    pass


class Group(Base):
    """Joined by some eligible queries, so a claim has a second application table to lock."""

    __tablename__ = "conf_group"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    active: Mapped[bool]
    label: Mapped[str | None] = mapped_column(String(64))


class Item(Base):
    __tablename__ = "conf_item"

    # Explicit keys everywhere: tests decide the key order, not a sequence.
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    group_id: Mapped[int] = mapped_column(ForeignKey("conf_group.id"))
    enabled: Mapped[bool] = mapped_column(default=True)
    priority: Mapped[int] = mapped_column(default=0)
    note: Mapped[str | None] = mapped_column(String(64))


class Keyed(Base):
    """A source with a non-integer primary key: no watermark, discovery must sweep."""

    __tablename__ = "conf_keyed"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    label: Mapped[str | None] = mapped_column(String(64))


def key(label: str) -> str:
    """A deterministic UUID string, so failures are reproducible."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"dbworker-conformance/{label}"))


def handler(source: Any, session: Session) -> Finished:
    """Registered for every conformance worker; the checks never run handlers."""
    return Finished()


@dataclass(frozen=True)
class ItemRow:
    id: int
    group_id: int
    enabled: bool
    priority: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "group_id": self.group_id,
            "enabled": self.enabled,
            "priority": self.priority,
        }


#: (id, active): groups 1 and 3 are active.
GROUPS: tuple[tuple[int, bool], ...] = ((1, True), (2, False), (3, True))

#: Priorities are distinct and unrelated to key order, so "the eligible query's order"
#: and "primary-key order" give different answers.
ITEMS: tuple[ItemRow, ...] = (
    ItemRow(1, 1, True, 10),
    ItemRow(2, 2, True, 50),
    ItemRow(3, 1, False, 90),
    ItemRow(4, 3, True, 70),
    ItemRow(5, 2, False, 20),
    ItemRow(6, 1, True, 30),
    ItemRow(7, 3, True, 80),
    ItemRow(8, 2, True, 60),
    ItemRow(9, 3, False, 40),
    ItemRow(10, 1, True, 100),
    ItemRow(11, 1, True, 5),
    ItemRow(12, 3, True, 15),
)
