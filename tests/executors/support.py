"""The executor suite's rig: one test's database, work directory and coordinators."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import Engine, create_engine, select
from sqlalchemy.orm import Session, sessionmaker

from dbworker import (
    AsyncIO,
    Coordinator,
    ExecutionState,
    ExecutionStatus,
    Inline,
    Pool,
    RetryPolicy,
    SpawnPerTask,
    Subprocess,
    Threads,
)
from dbworker.dialects import for_url
from dbworker.executors import ExecutorChoice
from runfiles import write_atomically
from waiting import wait_until

from . import app

T = TypeVar("T")

EXECUTORS = ("pool", "spawn", "subprocess", "inline", "threads")
PROCESS_EXECUTORS = ("pool", "spawn", "subprocess")

#: Far longer than any wait: an item run again within a wait was released by the
#: coordinator, never taken over after its lease ran out.
LONG_LEASE = 120.0

INLINE_CANNOT_KILL = "the inline executor runs handlers in threads, which cannot be killed"
INLINE_SHARES_PROCESS = (
    "the inline executor runs handlers in the test's own process: os._exit or SIGKILL "
    "would end the test run"
)
INLINE_NO_IMPORT = "the inline executor calls the handler object itself; nothing is imported"


def child_env(**extra: str) -> dict[str, str]:
    """An environment in which a ``python -m`` child imports what this process does
    (dbworker, the test modules)."""
    paths = [os.path.abspath(p) for p in sys.path if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **extra}


def make_choice(name: str, **options: Any) -> ExecutorChoice:
    if name == "pool":
        return Pool(**options)
    if name == "spawn":
        return SpawnPerTask(**options)
    if name == "subprocess":
        return Subprocess(**{"env": child_env(), **options})
    if name == "inline":
        return Inline(**options)
    if name == "threads":
        return Threads(**options)
    if name == "asyncio":
        return AsyncIO(**options)
    raise AssertionError(f"unknown executor {name!r}")


def executor_params(names: tuple[str, ...] = EXECUTORS, inline: str | None = None) -> list[Any]:
    """Executor names as parameters; ``inline`` is the reason the case does not apply
    to the inline executor (it is then reported as skipped, not silently left out)."""
    return [
        pytest.param(
            name,
            id=name,
            marks=pytest.mark.skip(reason=inline) if name == "inline" and inline else (),
        )
        for name in names
    ]


def open_engine(url: str) -> Engine:
    """Set up as dbworker's own engines: SQLite waits for a busy writer, MySQL reads
    committed rows."""
    dialect = for_url(url)
    engine = create_engine(url, **dialect.coordinator_engine_options())
    dialect.configure_engine(engine)
    return engine


@dataclass(frozen=True)
class EffectRow:
    worker: str
    item_id: int
    run: int
    pid: int
    info: dict[str, Any]


@dataclass
class Rig:
    url: str
    engine: Engine
    workdir: Path
    coordinators: list[Coordinator] = field(default_factory=list)

    # -- coordinators ----------------------------------------------------------------

    def coordinator(
        self,
        executor: ExecutorChoice | str,
        *,
        concurrency: int = 1,
        lease_seconds: float = LONG_LEASE,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        max_crashes: int = 3,
        handler: Callable[..., Any] = app.handle,
        dependent: bool = False,
        worker_executor: ExecutorChoice | str | None = None,
    ) -> Coordinator:
        """A coordinator of the ``job`` worker (and, with ``dependent``, of ``after_job``,
        which takes items once ``job`` has finished them), tables created, not started."""
        coordinator = Coordinator(
            sessionmaker(self.engine),
            database_url=self.url,
            lease_seconds=lease_seconds,
            # Quick polls keep the tests short; they do not change what is tested.
            poll_seconds=0.05,
            max_poll_seconds=0.2,
            executor=executor,
        )
        self.coordinators.append(coordinator)
        coordinator.transactional_worker(
            name=app.WORKER,
            source=app.Item,
            concurrency=concurrency,
            timeout=timeout,
            retry=retry,
            max_crashes=max_crashes,
            executor=worker_executor,
        )(handler)
        if dependent:
            finished = coordinator.has_execution_status(
                worker=app.WORKER, source_id=app.Item.id, statuses=(ExecutionStatus.FINISHED,)
            )
            coordinator.transactional_worker(
                name=app.DEPENDENT,
                source=app.Item,
                eligible=lambda: select(app.Item).where(finished).order_by(app.Item.id),
                concurrency=concurrency,
            )(app.handle_dependent)
        coordinator.create_worker_tables()
        return coordinator

    def stop_all(self) -> None:
        # Gated inline handlers cannot be killed: let them finish first.
        write_atomically(self.workdir / app.ALL_GATES)
        for coordinator in self.coordinators:
            coordinator.stop(timeout=0)

    # -- items and what happened to them ----------------------------------------------

    def add(self, *plans: str) -> list[int]:
        """Insert items 1..n with the given plans; return their ids."""
        with Session(self.engine) as session, session.begin():
            start = 1 + (session.scalar(select(app.Item.id).order_by(app.Item.id.desc())) or 0)
            ids = list(range(start, start + len(plans)))
            session.add_all(
                app.Item(id=i, plan=plan, workdir=str(self.workdir))
                for i, plan in zip(ids, plans, strict=True)
            )
        return ids

    def state(
        self, coordinator: Coordinator, item_id: int, worker: str = app.WORKER
    ) -> ExecutionState | None:
        with Session(self.engine) as session:
            return coordinator.workers[worker].state(session, item_id)

    def status(
        self, coordinator: Coordinator, item_id: int, worker: str = app.WORKER
    ) -> ExecutionStatus | None:
        found = self.state(coordinator, item_id, worker)
        return None if found is None else found["execution_status"]

    def wait_status(
        self,
        coordinator: Coordinator,
        item_ids: list[int],
        status: ExecutionStatus,
        worker: str = app.WORKER,
    ) -> None:
        def seen() -> dict[int, ExecutionStatus | None]:
            return {i: self.status(coordinator, i, worker) for i in item_ids}

        try:
            wait_until(lambda: set(seen().values()) == {status}, f"items {item_ids} {status}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last seen {seen()}") from None

    def runs(self, item_id: int, worker: str = app.WORKER) -> list[int]:
        """Pids of the announced runs of ``item_id``, in run order."""
        pids = []
        number = 1
        while (path := app.run_path(self.workdir, worker, item_id, number)).exists():
            pids.append(int(path.read_text()))
            number += 1
        return pids

    def wait_run(self, item_id: int, run: int, worker: str = app.WORKER) -> int:
        """Wait until run ``run`` of ``item_id`` has started; return its pid."""
        path = app.run_path(self.workdir, worker, item_id, run)
        wait_until(path.exists, f"run {run} of item {item_id} to start")
        return int(path.read_text())

    def wait_locked(self, item_id: int, run: int) -> None:
        """Wait until run ``run`` of ``item_id`` holds the lock of its ``lock`` action."""
        path = app.locked_path(self.workdir, item_id, run)
        wait_until(path.exists, f"run {run} of item {item_id} to hold its lock")

    def open_gate(self, item_id: int, run: int) -> None:
        write_atomically(app.gate_path(self.workdir, item_id, run))

    def effects(self, worker: str | None = app.WORKER) -> list[EffectRow]:
        query = select(app.Effect).order_by(app.Effect.id)
        if worker is not None:
            query = query.where(app.Effect.worker == worker)
        with Session(self.engine) as session:
            return [
                EffectRow(e.worker, e.item_id, e.run, e.pid, json.loads(e.info))
                for e in session.scalars(query)
            ]
