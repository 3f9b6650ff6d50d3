"""The executor boundary: how a claimed item's handler gets run.

An executor receives ``Task`` objects and hands back ``Result`` objects (both
plain data from ``core.tasks``). It starts, watches, kills and recycles the
processes; what runs inside them is the ``Runner`` the coordinator hands it,
which alone touches the database. Executors know nothing of dialects or of
scheduling; the coordinator knows nothing of processes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..core.tasks import Result, Task, TaskKey


class Runner(Protocol):
    """What runs in a handler process. Picklable: process executors send it to each
    child, where its methods run."""

    def warm_up(self) -> None:
        """Pay a new process's first-use costs (imports, connecting) before it gets work.
        A failure is not an error here: the first task meets it and reports it."""

    def run(self, task: Task) -> Result:
        """Run one invocation and record its outcome under the task's token."""
        ...

    def dispose(self) -> None:
        """Close what the process opened (before it exits)."""

    def for_fork(self) -> Runner:
        """What a process forked from this one runs (prepared once here, shared by
        every process forked afterwards, holding no connection)."""
        ...


class ConcurrentRunner(Runner, Protocol):
    """A runner whose process runs several invocations at once: on threads (``run``
    from each), or as tasks of one event loop (``async def`` handlers)."""

    def concurrent(self, count: int) -> None:
        """Up to ``count`` invocations will run at once in this process (before any)."""

    async def start_async(self, capacity: int, driver: str | None) -> None:
        """Before the event loop's first invocation (``driver``: the asyncio driver)."""

    def run_later(self, task: Task, later: Callable[[Result], None]) -> Result | None:
        """``run`` from one of several threads: an invocation whose ending is handed
        over to go with others' returns None at once, and ``later`` (thread-safe) gets
        its result once committed."""
        ...

    async def run_async(self, task: Task, returned: Callable[[], None] | None = None) -> Result:
        """``run`` for an ``async def`` handler, on the running event loop.
        ``returned`` is called once the handler has returned, before its ending
        commits (its slot may take the next task meanwhile)."""
        ...

    def prepare_waiting(self, task: Task) -> None:
        """``task`` waits in this process for a slot (a thread, or room on the event
        loop): what its start needs may be fetched now (its row read), so that it
        starts at once when one frees."""

    def prepare_start(self, task: Task) -> None:
        """``task`` starts at once on a thread: what its start needs may be fetched
        with that of others arriving together (their rows read in one statement)."""

    def forget_waiting(self, key: TaskKey) -> None:
        """A task ``prepare_waiting`` was given will not start here (it was withdrawn)."""

    async def dispose_async(self) -> None:
        """Close what ``start_async`` and ``run_async`` opened."""


class TemplateRunner(ConcurrentRunner, Protocol):
    """A runner that can also prepare a spawn-per-task template and the processes it
    forks (see ``executors.spawn``); ``lane`` values are opaque to the executor."""

    def prepare_template(self) -> None: ...

    def learn(self, worker: str, payload: bytes, source_id: Any) -> None: ...

    def lend(self, limit: int) -> tuple[Any, bool]: ...

    def lent_to(self, pid: int, lane: Any) -> None: ...

    def exited(self, pid: int, exitcode: int) -> None: ...

    def forked(self, lane: Any) -> Any: ...

    def leave(self, lane: Any, lent: Any) -> int: ...


class Executor(ABC):
    """Runs handlers; at most ``slots`` at a time.

    ``parent_pid`` is the coordinator's: a handler process that outlives it exits.
    """

    #: Whether a task's handler process uses the source row a task carries
    #: (``Task.row``) instead of reading it: the pool's and the multiplexed processes.
    #: The scheduler reads rows for no other.
    uses_rows = False

    def __init__(self, slots: int, runner: Runner, parent_pid: int) -> None:
        self.slots = slots
        self.runner = runner
        self.parent_pid = parent_pid

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def free_slots(self) -> int: ...

    @abstractmethod
    def submit(self, task: Task) -> None:
        """Start ``task``; the caller ensures a slot is free."""

    def submit_all(self, tasks: Sequence[Task]) -> None:
        """Start ``tasks`` (one claim's), in order; the caller ensures slots are free."""
        for task in tasks:
            self.submit(task)

    @abstractmethod
    def wait_handles(self) -> Sequence[Any]:
        """Objects for ``multiprocessing.connection.wait`` that fire when a result may be ready."""

    @abstractmethod
    def collect(self) -> list[Result]:
        """Results that are ready, including crashes of processes running a task."""

    def collect_by(self) -> float | None:
        """When to call ``collect`` even if no wait handle fired (``time.monotonic()``):
        an executor may leave a result unread for a moment when nothing waits on it."""
        return None

    def loop_lags(self) -> list[float]:
        """How long (seconds) an event loop of this executor was blocked by a handler,
        each time since the last call (the asyncio executor; others never are)."""
        return []

    @abstractmethod
    def kill(self, task_key: TaskKey) -> bool:
        """Stop the handler of ``task_key`` at once; no result will be reported for it."""

    @abstractmethod
    def started(self, task_key: TaskKey) -> float | None:
        """When the handler of ``task_key`` started (``time.monotonic()``); None while
        it waits to start (claimed ahead) or once it is over."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop every process (running handlers are killed)."""
