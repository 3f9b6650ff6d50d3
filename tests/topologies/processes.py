"""What every topology helper needs: free ports, programs, users, waiting."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path


class TopologyUnavailable(Exception):
    """The programs a topology needs are not installed (a skip, unless required)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now (the kernel's choice)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def program(path: str) -> str:
    """``path`` (absolute, or a name on PATH), or TopologyUnavailable."""
    found = path if os.access(path, os.X_OK) else shutil.which(path)
    if not found:
        raise TopologyUnavailable(f"{path} is not installed")
    return found


def as_user(user: str, argv: Sequence[str]) -> list[str]:
    """``argv`` run as ``user`` when we are root (servers refuse to run as root)."""
    if os.geteuid() != 0:
        return list(argv)
    return [program("runuser"), "-u", user, "--", *argv]


def give_to(user: str, path: Path) -> None:
    """Make ``user`` own ``path`` (when we are root and it exists)."""
    if os.geteuid() != 0:
        return
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)


def run(argv: Sequence[str], timeout: float = 120) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip() or done.stdout}"
        )
    return done.stdout


def wait_for(ready: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready after {timeout}s")
        time.sleep(0.1)


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0
