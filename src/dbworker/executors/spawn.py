"""Spawn-per-task: every invocation runs in a process of its own, forked from a warm template.

A fresh interpreter per item would cost a hundred milliseconds or more (imports,
the database driver, SQLAlchemy's dialect start-up queries, the ORM's mapper
configuration). Instead one *template* process pays those once: it is started
from multiprocessing's fork server (the handler modules already imported), opens
and closes a connection so the SQLAlchemy dialect is initialised, configures the
mappers, builds each worker's execution table and rehearses its statements. For
each invocation the template forks; the copy connects, says it is ready, runs
exactly one handler and exits. The template never runs a handler, so every
handler process starts from the same clean state: the isolation of spawn-per-task
at the price of a fork and a connect. Where the database allows it (PostgreSQL),
not even the connect: the template lends each process an idle connection of its
own, whose session the process resets on its way out (``invocation.lending``).
What touches the database, in the template and in each process, is the runner's
(``TemplateRunner``); this module only forks, watches and reaps.

The template is single-threaded (its loop selects on its control connection, the
coordinator and its children), so forking it is safe, unlike forking the threaded
coordinator. Exit statuses come from the template, the processes' parent; the
coordinator watches and kills each process through a pidfd, which cannot name a
reused pid. Without pidfds (not Linux) spawn-per-task falls back to a pool whose
processes each run one task (see ``strategies.SpawnPerTask``).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import multiprocessing
import os
import select
import signal
import socket
import sys
import time
from collections import OrderedDict
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import recv_handle, send_handle
from typing import Any

from ..core.tasks import Task
from .base import TemplateRunner
from .children import ProcessHandle, default_start_method, end, start_process
from .pool import ProcessPool
from .process import READY, answer, receive, send, watch_parent

#: How many exit statuses of processes not (yet) known by pid are kept.
MAX_UNCLAIMED_STATUSES = 4096
#: How long shutdown waits for the template to exit before killing it.
TEMPLATE_EXIT_SECONDS = 5.0

log = logging.getLogger("dbworker")


def pidfds_supported() -> bool:
    """Whether this system can watch and signal processes through pidfds (Linux >= 5.3)."""
    if not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
        return False
    try:
        fd = os.pidfd_open(os.getpid())
    except OSError:
        return False
    os.close(fd)
    return True


# -- in the template process ------------------------------------------------------------


def template_main(control: Connection, runner: TemplateRunner, parent_pid: int) -> None:
    # Ctrl-C reaches the whole process group; the coordinator decides how to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    runner.prepare_template()
    _freeze()
    coordinator = os.pidfd_open(parent_pid)
    children: dict[int, int] = {}  # pidfd -> pid
    try:
        _serve(control, coordinator, children, runner, parent_pid)
    except (EOFError, OSError):
        pass  # the coordinator closed its end: it is stopping, or gone
    finally:
        # Those still running were told to stop or killed; reap them, briefly.
        deadline = time.monotonic() + TEMPLATE_EXIT_SECONDS
        for fd, pid in children.items():
            if select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                os.waitpid(pid, 0)


def _serve(
    control: Connection,
    coordinator: int,
    children: dict[int, int],
    runner: TemplateRunner,
    parent_pid: int,
) -> None:
    while True:
        readable, _, _ = select.select([control.fileno(), coordinator, *children], [], [])
        if coordinator in readable:
            return  # orphaned: the handler processes watch the coordinator themselves
        for fd in readable:
            if fd in children:
                pid = children.pop(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                exitcode = os.waitstatus_to_exitcode(status)
                runner.exited(pid, exitcode)
                control.send(("exited", pid, exitcode))
        if control.fileno() not in readable:
            continue
        message = control.recv()
        if message is None:
            return
        if message[0] == "learn":
            runner.learn(*message[1:])
            _freeze()
        elif message[0] == "fork":
            channel = recv_handle(control)
            lane, new = runner.lend(limit=message[1])
            if new:
                _freeze()  # the new connection's objects too: see _freeze
            try:
                pid = os.fork()
            except OSError as exc:  # out of processes or memory: the coordinator sees EOF
                log.error("dbworker: cannot fork a handler process: %s", exc)
                os.close(channel)
                continue
            if pid == 0:
                inherited = [control.fileno(), coordinator, *children]
                _forked(channel, runner, parent_pid, inherited, lane)
            os.close(channel)
            children[os.pidfd_open(pid)] = pid
            runner.lent_to(pid, lane)


def _freeze() -> None:
    # Everything the template holds now is shared with its children until written:
    # keep the children's garbage collector from walking (and so copying) it.
    gc.collect()
    gc.freeze()


def _forked(
    channel: int, runner: TemplateRunner, parent_pid: int, inherited: list[int], lane: Any
) -> None:
    """A handler process: connect (or take over ``lane``'s connection), say ready, run
    one invocation, exit. Never returns."""
    status = 1
    try:
        for fd in inherited:
            os.close(fd)  # the template's; holding them would hide its exit and theirs
        watch_parent(parent_pid)
        conn = Connection(channel)
        lent = runner.forked(lane)
        try:
            send(conn, (READY, os.getpid()))
            message = receive(conn)
            if message is not None:
                send(conn, answer(runner, message))
        except (EOFError, OSError):
            pass  # the coordinator let this process go (shutdown) or died
        status = runner.leave(lane, lent)
    except BaseException:
        with contextlib.suppress(Exception):
            import traceback

            traceback.print_exc()
    finally:
        # Like every multiprocessing child, leave without running the template's
        # exit handlers (it is the template's state, not ours).
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(status)


# -- in the coordinator -------------------------------------------------------------------


class Template:
    """The coordinator's handle on the template process and its control connection."""

    def __init__(
        self,
        runner: TemplateRunner,
        parent_pid: int,
        start_method: str | None,
        lane_limit: int,
    ) -> None:
        #: At most this many connections lent at once (processes running, spare, exiting).
        self.lane_limit = lane_limit
        context = multiprocessing.get_context(start_method or default_start_method())
        self.process, self.control = start_process(
            context, template_main, "dbworker-template", runner, parent_pid
        )
        self._statuses: OrderedDict[int, int] = OrderedDict()
        self._learned: set[str] = set()
        self._closed = False

    def alive(self) -> bool:
        return not self._closed and bool(self.process.is_alive())

    def learn(self, worker: str, payload: bytes, source_id: Any) -> None:
        """Have the template prepare for ``worker`` (once), using one of its items."""
        if worker not in self._learned:
            self._learned.add(worker)
            with contextlib.suppress(OSError):
                self.control.send(("learn", worker, payload, source_id))

    def fork(self) -> tuple[ForkedProcess, Connection]:
        ours, theirs = socket.socketpair()
        handle = ForkedProcess(self)
        try:
            self.control.send(("fork", self.lane_limit))
            send_handle(self.control, theirs.fileno(), self.process.pid)
        except OSError:
            pass  # the template is gone: the new process's socket reads EOF at once
        finally:
            theirs.close()
        return handle, Connection(ours.detach())

    def pump(self, timeout: float | None = 0.0) -> bool:
        """Read the template's exit reports; return whether any arrived."""
        got = False
        if self._closed:
            return got  # what it had not reported is lost with it
        with contextlib.suppress(EOFError, OSError):
            while self.control.poll(timeout):
                _, pid, exitcode = self.control.recv()
                self._statuses[pid] = exitcode
                while len(self._statuses) > MAX_UNCLAIMED_STATUSES:
                    self._statuses.popitem(last=False)
                got = True
                timeout = 0.0
        return got

    def exit_status(self, pid: int, timeout: float | None = 0.0) -> int | None:
        """The exit status of ``pid`` once the template reaped it (waiting up to ``timeout``)."""
        if pid not in self._statuses:
            self.pump()
        if pid in self._statuses or timeout == 0.0 or self._closed:
            return self._statuses.pop(pid, None)
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid not in self._statuses:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait([self.control, self.process.sentinel], remaining)
            if not ready:
                return None
            if not self.pump() and not self.alive():
                return None  # the template died: this status is lost with it
        return self._statuses.pop(pid)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self.control.send(None)
        end(self.process, TEMPLATE_EXIT_SECONDS)
        self.control.close()


class ForkedProcess:
    """A handler process forked by the template, seen as a multiprocessing Process."""

    def __init__(self, template: Template) -> None:
        self._template = template
        self.pid: int | None = None
        self._pidfd: int | None = None
        self._exitcode: int | None = None
        #: It ended before saying ready (so before its pid was known).
        self._lost = False

    def bind(self, pid: int) -> None:
        self.pid = pid
        try:
            self._pidfd = os.pidfd_open(pid)
        except OSError:
            self._exitcode = self._template.exit_status(pid)
            self._lost = self._exitcode is None

    def lost(self) -> None:
        self._lost = True

    @property
    def exitcode(self) -> int | None:
        if self._exitcode is None and self.pid is not None and not self.is_alive():
            self._exitcode = self._template.exit_status(self.pid)
        return self._exitcode

    @property
    def sentinel(self) -> Any:
        return self._pidfd

    def is_alive(self) -> bool:
        if self._lost or self._exitcode is not None:
            return False
        if self._pidfd is None:
            return self.pid is None and self._template.alive()
        readable, _, _ = select.select([self._pidfd], [], [], 0)
        return not readable

    def kill(self) -> None:
        if self._pidfd is not None and self._exitcode is None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def join(self, timeout: float | None = None) -> None:
        if self._pidfd is None:
            return
        if not wait([self._pidfd], timeout):
            return
        if self._exitcode is None and self.pid is not None:
            # Dead, so the template reaps it at once; its report is on its way.
            self._exitcode = self._template.exit_status(self.pid, timeout)
        os.close(self._pidfd)
        self._pidfd = None
        if self._exitcode is None:
            self._lost = True


class SpawnExecutor(ProcessPool):
    """A pool whose every process runs one task, forked from a warm template."""

    def __init__(
        self,
        slots: int,
        runner: TemplateRunner,
        parent_pid: int,
        start_method: str | None = None,
    ) -> None:
        # A spare per slot: when a task ends, the next process is already connected.
        super().__init__(
            slots, runner, parent_pid, start_method, max_tasks_per_child=1, spares=slots
        )
        self.template_runner = runner
        self._start_method = start_method
        self._template: Template | None = None
        #: An item of each worker seen, for a new template to prepare with.
        self._examples: dict[str, Any] = {}

    def _launch(self) -> tuple[ProcessHandle, Connection]:
        if self._template is None or not self._template.alive():
            if self._template is not None:
                self._template.shutdown()
            # Processes running, spare, and on their way out (one per slot at most:
            # a process exits right after its result, as its successor starts).
            lanes = 2 * self.slots + self.spares
            self._template = Template(
                self.template_runner, self.parent_pid, self._start_method, lanes
            )
            for worker, source_id in self._examples.items():
                self._template.learn(worker, self._payloads[worker], source_id)
        return self._template.fork()

    def submit_all(self, tasks: Sequence[Task]) -> None:
        super().submit_all(tasks)
        for task in tasks:
            self._examples.setdefault(task.worker, task.source_id)
            if self._template is not None:
                self._template.learn(task.worker, self._payloads[task.worker], task.source_id)

    def collect(self) -> list[Any]:
        if self._template is not None:
            self._template.pump()
        return super().collect()

    def _ready_message(self, child: Any, message: Any) -> bool:
        if not (isinstance(message, tuple) and message[0] == READY):
            return False
        child.process.bind(message[1])
        return True

    def _closed_before_ready(self, child: Any) -> None:
        child.process.lost()

    def shutdown(self) -> None:
        super().shutdown()
        if self._template is not None:
            self._template.shutdown()
            self._template = None
