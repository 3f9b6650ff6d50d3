"""The application the conformance checks run against: its tables and rows, the workers
that serve them, and the eligible queries the claims are checked with.

Everything lives in its own MetaData (``ConformanceBase.metadata``), execution tables
included, so that the kit can drop exactly what it created.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ForeignKey, Integer, Select, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from ..core.limits import Rate
from ..dialects import Limits, WorkerTable
from ..schema import execution_table, rate_slots_table


class ConformanceBase(DeclarativeBase):
    pass


class Group(ConformanceBase):
    """Joined by some eligible queries, so a claim has a second application table to lock."""

    __tablename__ = "conf_group"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    active: Mapped[bool]
    label: Mapped[str | None] = mapped_column(String(64))


class Item(ConformanceBase):
    __tablename__ = "conf_item"

    # Explicit keys everywhere: checks decide the key order, not a sequence.
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    group_id: Mapped[int] = mapped_column(ForeignKey("conf_group.id"))
    enabled: Mapped[bool] = mapped_column(default=True)
    priority: Mapped[int] = mapped_column(default=0)
    note: Mapped[str | None] = mapped_column(String(64))


class Keyed(ConformanceBase):
    """A source with a non-integer primary key: no watermark, discovery must sweep."""

    __tablename__ = "conf_keyed"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    label: Mapped[str | None] = mapped_column(String(64))


def key(label: str) -> str:
    """A deterministic UUID string, so failures are reproducible."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"dbworker-conformance/{label}"))


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

# -- the workers ---------------------------------------------------------------------------

ITEMS_WORKER = "conf_items"
FIRST_WORKER = "conf_first"
SECOND_WORKER = "conf_second"
KEYED_WORKER = "conf_keyed"
#: ``exclusive_by=Item.group_id``: never two WORKING items of one group.
EXCLUSIVE_WORKER = "conf_exclusive"
#: ``rate_limit="3/s"`` (the fake clock's seconds), and per group.
RATED_WORKER = "conf_rated"
RATED_BY_WORKER = "conf_rated_by"
RATE = Rate(3, 1.0)
SOURCES: dict[str, type[ConformanceBase]] = {
    ITEMS_WORKER: Item,
    FIRST_WORKER: Item,
    SECOND_WORKER: Item,
    KEYED_WORKER: Keyed,
    EXCLUSIVE_WORKER: Item,
    RATED_WORKER: Item,
    RATED_BY_WORKER: Item,
}


def _limits(name: str) -> Limits | None:
    # As ``limit_options.check_limits`` makes them from a registration's arguments.
    group = Item.__table__.c.group_id
    slots = rate_slots_table(ConformanceBase.metadata)
    return {
        EXCLUSIVE_WORKER: Limits(exclusive_key=group),
        RATED_WORKER: Limits(rate=RATE, slots=slots),
        RATED_BY_WORKER: Limits(rate=RATE, rate_key=group, slots=slots),
    }.get(name)


def _worker(name: str) -> WorkerTable:
    # As a worker's registration makes it: the execution table in the source's MetaData.
    pk = SOURCES[name].__table__.c.id
    limits = _limits(name)
    keyed = limits is not None and limits.keyed
    table = execution_table(name, pk.type, ConformanceBase.metadata, keyed=keyed)
    monotonic = isinstance(pk.type, Integer)
    return WorkerTable(name, table, pk, monotonic_keys=monotonic, limits=limits)


WORKERS: dict[str, WorkerTable] = {name: _worker(name) for name in SOURCES}

# -- eligible queries ----------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """An eligible query, with the same rule restated in Python to derive the expected
    claim order independently of the database."""

    name: str
    query: Callable[[], Select[Any]]
    keep: Callable[[ItemRow, dict[int, bool]], bool]
    order: Callable[[ItemRow], Any]

    def expected(self) -> list[int]:
        active = dict(GROUPS)
        return [row.id for row in sorted(ITEMS, key=self.order) if self.keep(row, active)]


VARIANTS: dict[str, Variant] = {
    # A filter and an ORDER BY that is not key order.
    "ordered": Variant(
        "ordered",
        lambda: select(Item).where(Item.enabled.is_(True)).order_by(Item.priority.desc()),
        lambda row, _active: row.enabled,
        lambda row: -row.priority,
    ),
    # A join to another application table.
    "join": Variant(
        "join",
        lambda: (
            select(Item)
            .join(Group, Item.group_id == Group.id)
            .where(Group.active.is_(True))
            .order_by(Item.id)
        ),
        lambda row, active: active[row.group_id],
        lambda row: row.id,
    ),
    # An IN semi-join with ORDER BY: the plan shape MariaDB has been seen to answer with
    # no rows for a second locking claimer.
    "semijoin": Variant(
        "semijoin",
        lambda: (
            select(Item)
            .where(
                Item.group_id.in_(select(Group.id).where(Group.active.is_(True))),
                Item.enabled.is_(True),
            )
            .order_by(Item.priority.desc())
        ),
        lambda row, active: active[row.group_id] and row.enabled,
        lambda row: -row.priority,
    ),
}


def by_id() -> Select[Any]:
    return select(Item).order_by(Item.id)
