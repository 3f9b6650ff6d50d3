"""A type checker catches a handler that cannot work: mypy --strict, through its API,
on an application module as a newcomer writes it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api")

APP = """\
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from dbworker import Coordinator, ExecutionState, Finished, Outcome, Unfinished

coordinator = Coordinator(sessionmaker(), database_url="sqlite:///app.db")


class Base(DeclarativeBase):
    pass


class Upload(Base):
    __tablename__ = "uploads"
    id: Mapped[int] = mapped_column(primary_key=True)


class Invoice(Base):
    __tablename__ = "invoices"
    id: Mapped[int] = mapped_column(primary_key=True)
"""


def mypy(tmp_path: Path, code: str) -> tuple[str, int]:
    """mypy --strict on APP + ``code``, ignoring the project's own configuration."""
    module = tmp_path / "tasks.py"
    module.write_text(APP + "\n\n" + textwrap.dedent(code))
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n")
    stdout, stderr, status = api.run(
        ["--strict", "--config-file", str(config), "--cache-dir", str(tmp_path / "cache"),
         str(module)]
    )  # fmt: skip
    return stdout + stderr, status


@pytest.mark.parametrize(
    ("code", "message"),
    [
        pytest.param(
            """
            @coordinator.transactional_worker(name="render", source=Upload)
            def render(upload: Upload, session: Session) -> None:
                upload.id += 0  # forgot to return Finished()
            """,
            'error: Value of type variable "OutcomeType" of "__call__" of "HandlerDecorator" '
            'cannot be "None"',
            id="returns-none",
        ),
        pytest.param(
            """
            @coordinator.transactional_worker(name="render", source=Upload)
            def render(invoice: Invoice, session: Session) -> Finished:
                return Finished()
            """,
            'incompatible type "Callable[[Invoice, Session], Finished]"; '
            'expected "Callable[[Upload, Session], Finished]"',
            id="another-model",
        ),
        pytest.param(
            """
            def attempts(session: Session, upload_id: int) -> int:
                state = coordinator.workers["render"].state(session, upload_id)
                return 0 if state is None else state["attempt"]
            """,
            'TypedDict "ExecutionState" has no key "attempt"',
            id="state-key",
        ),
    ],
)
def test_a_mistake_is_a_type_error(tmp_path: Path, code: str, message: str) -> None:
    output, status = mypy(tmp_path, code)
    assert status == 1, output
    assert message in output, output


def test_correct_handlers_and_state_reads_type_check(tmp_path: Path) -> None:
    output, status = mypy(
        tmp_path,
        """
        @coordinator.transactional_worker(name="render", source=Upload)
        def render(upload: Upload, session: Session) -> Outcome:
            return Unfinished() if upload.id % 2 else Finished()


        @coordinator.transactional_worker(name="thumbnail", source=Upload)
        def thumbnail(upload: Upload, session: Session) -> Finished:
            return Finished()


        def attempts(session: Session, upload_id: int) -> int:
            state: ExecutionState | None = coordinator.workers["render"].state(
                session, upload_id
            )
            return 0 if state is None else state["attempts"]


        reveal_type(render)
        """,
    )
    assert status == 0, output
    assert (
        'Revealed type is "def (tasks.Upload, sqlalchemy.orm.session.Session) -> '
        'dbworker.core.outcomes.Finished | dbworker.core.outcomes.Unfinished"'
    ) in output
