"""Small applications written to a directory and run as a newcomer would run them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

#: The console script, beside the interpreter running the tests.
DBWORKER = str(Path(sys.executable).with_name("dbworker"))
#: Generous: only bounds how long a hung subprocess takes to fail the test.
TIMEOUT = 180.0

#: A model, a coordinator and one worker, as a README reader writes them. ``{url}``
#: defaults to a file beside the script.
APP = """\
import time

from sqlalchemy import create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from dbworker import Coordinator, Finished

URL = {url!r}
engine = create_engine(URL)
session_factory = sessionmaker(engine)
coordinator = Coordinator(session_factory, database_url=URL, poll_seconds=0.05)


class Base(DeclarativeBase):
    pass


class Item(Base):
    __tablename__ = "items"
    id: Mapped[int] = mapped_column(primary_key=True)


@coordinator.transactional_worker(name="work", source=Item)
def work(item: Item, session: Session) -> Finished:
    return Finished()

"""


def write_app(
    directory: Path, name: str, body: str, url: str | None = None, create: bool = True
) -> Path:
    """Write ``APP`` followed by ``body`` (dedented) to ``directory/name``; with
    ``create``, the application creates its table when imported."""
    path = directory / name
    url = url or f"sqlite:///{directory / 'app.sqlite'}"
    setup = "Base.metadata.create_all(engine)\n" if create else ""
    path.write_text(APP.format(url=url) + setup + "\n" + textwrap.dedent(body))
    return path


def run_python(
    *args: str | Path, cwd: Path, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` (a script, ``-m module``, or the console script) to completion."""
    program = [] if str(args[0]) == DBWORKER else [sys.executable]
    return subprocess.run(
        [*program, *map(str, args)],
        cwd=cwd,
        env=None if env is None else dict(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
