"""The same-host channel: one Unix datagram socket per running coordinator.

Why datagram sockets in a directory per database: they need no server and no
database round trip (SQLite has neither NOTIFY nor a server); a send never blocks
the writer (a full receiver queue means that receiver is already due to wake);
several coordinators can listen at once, each on its own socket; a coordinator that
died leaves a socket file that refuses the next send and is removed by the sender.
FIFOs would block or fail writers when no one reads, and would need one reader.

The directory is ``$DBWORKER_RUNTIME_DIR`` or ``<tempdir>/dbworker-<uid>``, mode
0700, then one subdirectory per database (a digest of its identity). Writers and
coordinators must run as the same user, with the same temporary directory, to meet.
A message is the names of the workers concerned, separated by spaces.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger("dbworker")

RUNTIME_DIR_ENV = "DBWORKER_RUNTIME_DIR"
#: A datagram carries at most this much; longer messages wake every worker.
MAX_MESSAGE = 8192
_WAKE_ALL = b"*"
#: How long a directory must have been unchanged for its listing to be kept.
QUIET_SECONDS = 1.0


def runtime_dir() -> Path:
    configured = os.environ.get(RUNTIME_DIR_ENV)
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / f"dbworker-{os.getuid()}"


def channel_dir(identity: str) -> Path:
    """The directory of one database's sockets (``identity`` names the database)."""
    digest = hashlib.sha256(identity.encode()).hexdigest()[:20]
    return runtime_dir() / digest


def _prepare(directory: Path) -> None:
    directory.parent.mkdir(mode=0o700, exist_ok=True)
    stat = directory.parent.stat()
    # Anyone who can write here can wake (not harm) our workers; still, refuse a
    # directory another user made for us.
    if stat.st_uid != os.getuid():
        raise PermissionError(f"{directory.parent} belongs to another user")
    directory.mkdir(mode=0o700, exist_ok=True)


def encode(names: Iterable[str] | None) -> bytes:
    if names is None:
        return _WAKE_ALL
    message = " ".join(sorted(names)).encode()
    return message if len(message) <= MAX_MESSAGE else _WAKE_ALL


class Sender:
    """Sends wake-ups to every coordinator listening on one database (thread-safe)."""

    def __init__(self, identity: str) -> None:
        self.directory = channel_dir(identity)
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()
        #: The sockets last listed, and the directory's (inode, mtime) they are of.
        self._listed: tuple[tuple[int, int], list[str]] | None = None

    def send(self, names: Iterable[str] | None, exclude: Path | None = None) -> int:
        """Wake the coordinators serving ``names`` (all workers for None); how many
        sockets took the message. Never raises: a wake-up is an optimisation."""
        message = encode(names)
        try:
            entries = [p for p in self._sockets() if exclude is None or p != str(exclude)]
        except OSError:
            return 0  # no coordinator has listened on this host
        sent = 0
        with self._lock:
            if self._socket is None:
                try:
                    self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    self._socket.setblocking(False)
                except OSError:
                    return 0
            for path in entries:
                try:
                    self._socket.sendto(message, path)
                    sent += 1
                except BlockingIOError:
                    sent += 1  # its queue is full: it is due to wake anyway
                except ConnectionRefusedError:
                    # Nobody is bound: a coordinator that died without cleaning up.
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                except OSError:
                    pass
        return sent

    def _sockets(self) -> list[str]:
        """The sockets in the directory. Listed again only when the directory changed:
        a listing is four system calls, its ``stat`` one, on the application's commit."""
        stat = os.stat(self.directory)
        version = (stat.st_ino, stat.st_mtime_ns)
        listed = self._listed
        if listed is not None and listed[0] == version:
            return listed[1]
        paths = [e.path for e in os.scandir(self.directory) if e.name.endswith(".sock")]
        # A socket bound within the same tick of the file system's coarse clock leaves
        # the time as it was: trust a listing only of a directory quiet for a while.
        quiet = time.time() - stat.st_mtime_ns / 1e9 > QUIET_SECONDS
        self._listed = (version, paths) if quiet else None
        return paths

    def close(self) -> None:
        with self._lock:
            if self._socket is not None:
                self._socket.close()
                self._socket = None


class Receiver:
    """One coordinator's socket. Its messages become wake-ups when the loop that waits
    on ``fileno()`` calls ``receive()``: the scheduler's own thread, which a thread of
    the socket's own would have to wake, one more hand-over on the way to a claim."""

    def __init__(self, identity: str, wake: Callable[[set[str] | None], None]) -> None:
        self.directory = channel_dir(identity)
        self._wake = wake
        self._socket: socket.socket | None = None
        self.path: Path | None = None

    def start(self) -> bool:
        """Bind the socket; False (said once in the log) if this host cannot have one,
        in which case polling finds the work."""
        try:
            _prepare(self.directory)
            path = self.directory / f"{os.getpid()}-{secrets.token_hex(4)}.sock"
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                sock.bind(str(path))
            except OSError:
                sock.close()
                raise
        except OSError as exc:
            log.warning(
                "dbworker: no local wake-up channel (%s); new work is found by polling", exc
            )
            return False
        sock.setblocking(False)
        self._socket, self.path = sock, path
        return True

    def fileno(self) -> int | None:
        """The socket's descriptor, readable when messages wait; None if not bound."""
        return None if self._socket is None else self._socket.fileno()

    def receive(self) -> None:
        """Turn every message waiting into a wake-up; returns at once if none waits."""
        sock = self._socket
        while sock is not None:
            try:
                message = sock.recv(MAX_MESSAGE + 1)
            except OSError:  # BlockingIOError: nothing more waits
                return
            self._wake(None if message == _WAKE_ALL else set(message.decode().split()))

    def stop(self) -> None:
        sock, path = self._socket, self.path
        if sock is None or path is None:
            return
        with contextlib.suppress(OSError):
            path.unlink()
        with contextlib.suppress(OSError):
            self.directory.rmdir()  # the database's directory, if no one else listens
        sock.close()
        self._socket = None
