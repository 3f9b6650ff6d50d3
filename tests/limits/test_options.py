"""Bad limits are refused at registration, naming the value (issue 26); an execution
table made before exclusive_by gets its held_key from create_worker_tables()."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Integer, String, create_engine, func, inspect
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from dbworker import ConfigurationError, Coordinator, Finished


class Base(DeclarativeBase):
    pass


class Doc(Base):
    __tablename__ = "limits_docs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner: Mapped[str] = mapped_column(String(32))


class Other(Base):
    __tablename__ = "limits_others"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner: Mapped[str] = mapped_column(String(32))


def handle(doc: Doc, session: Session) -> Finished:
    return Finished()


def handle2(doc: Any, session: Session) -> Finished:
    return Finished()


def _coordinator(tmp_path: Path) -> Coordinator:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    return Coordinator(sessionmaker(create_engine(url)), database_url=url)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"rate_limit": "5"}, "'5'"),
        ({"rate_limit": "5/day"}, "'5/day'"),
        ({"rate_limit": "0/s"}, "'0/s'"),
        ({"rate_limit": 5}, "5"),
        ({"exclusive_by": Other.owner}, "Other.owner"),
        ({"exclusive_by": func.lower(Other.owner)}, "limits_others"),
        ({"exclusive_by": "owner"}, "'owner'"),
        ({"rate_limit": "5/s", "rate_limit_by": Other.owner}, "Other.owner"),
        ({"rate_limit_by": Doc.owner}, "Doc.owner"),
    ],
)
def test_bad_limits_are_refused_at_registration(
    tmp_path: Path, options: dict[str, object], named: str
) -> None:
    coordinator = _coordinator(tmp_path)
    with pytest.raises(ConfigurationError) as caught:
        coordinator.transactional_worker("docs", Doc, **options)  # type: ignore[arg-type]
    assert named in str(caught.value)


def test_periodic_limits_are_checked(tmp_path: Path) -> None:
    coordinator = _coordinator(tmp_path)
    with pytest.raises(ConfigurationError, match="'fast'"):
        coordinator.periodic_worker(
            "tick", every=__import__("datetime").timedelta(seconds=1), rate_limit="fast"
        )
    with pytest.raises(ConfigurationError, match="exclusive"):
        coordinator.periodic_worker("tick", cron="* * * * *", exclusive="yes")  # type: ignore[arg-type]


def test_an_expression_of_the_source_is_accepted(tmp_path: Path) -> None:
    coordinator = _coordinator(tmp_path)
    coordinator.transactional_worker(
        "docs", Doc, exclusive_by=func.lower(Doc.owner), rate_limit="10/m", rate_limit_by=Doc.owner
    )(handle)
    assert "held_key" in coordinator.workers["docs"].execution_table.c


def test_create_worker_tables_adds_held_key_to_an_older_table(database_url: str) -> None:
    engine = create_engine(database_url)
    Base.metadata.create_all(engine, tables=[Base.metadata.tables["limits_docs"]])
    plain = Coordinator(sessionmaker(engine), database_url=database_url)
    plain.transactional_worker("docs_upgrade", Doc)(handle)
    plain.create_worker_tables()
    name = plain.workers["docs_upgrade"].execution_table.name
    assert "held_key" not in {c["name"] for c in inspect(engine).get_columns(name)}

    class Fresh(DeclarativeBase):
        pass

    class Doc2(Fresh):
        __tablename__ = "limits_docs"
        id: Mapped[int] = mapped_column(Integer, primary_key=True)
        owner: Mapped[str] = mapped_column(String(32))

    keyed = Coordinator(sessionmaker(engine), database_url=database_url)
    keyed.transactional_worker("docs_upgrade", Doc2, exclusive_by=Doc2.owner)(handle2)
    with pytest.raises(ConfigurationError, match="held_key"), Session(engine) as session:
        keyed._tables.check(session)
    keyed.create_worker_tables()
    assert "held_key" in {c["name"] for c in inspect(engine).get_columns(name)}
    indexes = {i["name"]: i for i in inspect(engine).get_indexes(name)}
    assert indexes[f"{name}_held_uq"]["unique"]
    keyed.create_worker_tables()  # idempotent
    engine.dispose()
