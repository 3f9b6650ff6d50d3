"""What tests read of the coordinators' execution records, for every flow-level harness."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from dbworker import Coordinator, ExecutionState, ExecutionStatus
from waiting import wait_until

#: Waits that span database restarts and a loaded CI machine.
DEADLINE = 90.0


class ExecutionReads:
    """Reads through the harness's ``session_factory``, as the application would."""

    session_factory: sessionmaker[Session]

    def status(
        self, coordinator: Coordinator, worker: str, source_id: Any
    ) -> ExecutionStatus | None:
        with self.session_factory() as session:
            return coordinator.execution_status(session, worker=worker, source_id=source_id)

    def state(self, coordinator: Coordinator, worker: str, source_id: Any) -> ExecutionState | None:
        with self.session_factory() as session:
            return coordinator.workers[worker].state(session, source_id)

    def statuses(
        self, coordinator: Coordinator, worker: str, ids: Iterable[Any]
    ) -> dict[Any, ExecutionStatus | None]:
        with self.session_factory() as session:
            return {
                i: coordinator.execution_status(session, worker=worker, source_id=i) for i in ids
            }

    def wait_for_status(
        self,
        coordinator: Coordinator,
        worker: str,
        ids: Iterable[Any],
        status: ExecutionStatus,
        timeout: float = DEADLINE,
    ) -> None:
        wanted = list(ids)
        wait_until(
            lambda: all(s is status for s in self.statuses(coordinator, worker, wanted).values()),
            f"{worker} items {wanted} to be {status.name}",
            timeout,
            diagnose=lambda: (
                f"statuses {self.statuses(coordinator, worker, wanted)}, "
                f"health {coordinator.health()}{self.diagnosis(worker)}"
            ),
        )

    def diagnosis(self, worker: str) -> str:
        """More to say when a wait times out (a harness adds what it knows)."""
        return ""
