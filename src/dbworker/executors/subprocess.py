"""The subprocess executor: handlers run in ``python -m`` children with their own
interpreter, environment and working directory (another virtualenv, say).

The child imports the handler and the source model by their import paths, so
both must live in modules that interpreter can import (not ``__main__``).
Results travel over an inherited socket, leaving the child's stdout and stderr
to the handler.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any

from .base import Runner
from .children import ProcessHandle
from .pool import ProcessPool

CHILD_MODULE = "dbworker.executors.subprocess_child"
FD_ENV = "DBWORKER_CHILD_FD"


class PopenHandle:
    """A ``subprocess.Popen`` seen through the multiprocessing Process interface."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        # A pidfd becomes readable when the process exits, like Process.sentinel.
        self._pidfd = os.pidfd_open(popen.pid) if hasattr(os, "pidfd_open") else None

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    @property
    def sentinel(self) -> Any:
        return self._pidfd

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class SubprocessPool(ProcessPool):
    def __init__(
        self,
        slots: int,
        runner: Runner,
        parent_pid: int,
        python: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        max_tasks_per_child: int | None = None,
        prefetch: int = 0,
    ) -> None:
        super().__init__(
            slots,
            runner,
            parent_pid,
            start_method="spawn",
            max_tasks_per_child=max_tasks_per_child,
            prefetch=prefetch,
        )
        self.python = python or sys.executable
        self.env = dict(os.environ if env is None else env)
        self.cwd = cwd

    def _launch(self) -> tuple[ProcessHandle, Connection]:
        parent_sock, child_sock = socket.socketpair()
        env = {**self.env, FD_ENV: str(child_sock.fileno())}
        popen = subprocess.Popen(
            [self.python, "-m", CHILD_MODULE],
            env=env,
            cwd=self.cwd,
            pass_fds=(child_sock.fileno(),),
            stdin=subprocess.DEVNULL,
        )
        child_sock.close()
        conn = Connection(parent_sock.detach())
        # A child that already exited (a broken interpreter or environment) cannot
        # take its runner; the pool sees it die before it is ready and says so.
        with contextlib.suppress(OSError):
            conn.send((self.runner, self.parent_pid))
        return PopenHandle(popen), conn
