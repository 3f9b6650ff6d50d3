"""Private database servers that a test may stop, kill and restart.

The shared local servers serve every other test running at the same time (other
xdist workers, other engineers), so an outage test must never touch them. Instead
it starts a server of its own: a fresh data directory under /tmp, a free port, its
own socket and pid file, and it tears everything down afterwards.

    server = start_private_server("postgresql")    # or "mysql" (MariaDB / MySQL)
    server.url                                      # SQLAlchemy URL of database "ops"
    server.stop("fast") / server.stop("immediate")  # graceful / crash-like shutdown
    server.kill9()                                  # SIGKILL the server's processes
    server.start()                                  # back up, same data, same port
    server.restart(mode, down_seconds)              # stop, stay down, start
    server.destroy()                                # stop and delete everything

PostgreSQL refuses to run as root: when the tests run as root (CI does), the data
directory is owned by the ``postgres`` OS user and the server programs run under
``runuser -u postgres``. Binaries are found on PATH or in the usual Debian/Ubuntu
places; ``DBWORKER_TEST_PG_BINDIR`` and ``DBWORKER_TEST_MARIADB_BINDIR`` override.
No pytest here: the fixture that decides between skip and fail is in conftest.py.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Literal

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from waiting import pid_alive, wait_until

StopMode = Literal["fast", "immediate"]

DATABASE = "ops"
#: How long a server may take to start or stop before we call it broken.
SERVER_WAIT_SECONDS = 60.0


class ServerUnavailable(Exception):
    """This machine cannot run a private server of that kind (binaries missing)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _children(pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            text = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2 :].split()[1]) == pid:
            found.append(int(name))
    return found


def _wait_gone(pids: list[int], what: str) -> None:
    wait_until(
        lambda: not any(pid_alive(pid) for pid in pids),
        f"{what}: processes {pids} to exit",
        timeout=SERVER_WAIT_SECONDS,
    )


class PrivateServer(ABC):
    backend: str

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.log = root / "server.log"
        self.port = free_port()
        self.running = False

    @property
    def url(self) -> str:
        return self._url(DATABASE)

    @property
    def admin_url(self) -> str:
        return self._url(None)

    @abstractmethod
    def _url(self, database: str | None) -> str: ...

    @abstractmethod
    def initialize(self) -> None:
        """Create the data directory (once)."""

    @abstractmethod
    def _start(self) -> None: ...

    @abstractmethod
    def _stop(self, mode: StopMode) -> None: ...

    @abstractmethod
    def _server_pids(self) -> list[int]: ...

    def start(self) -> None:
        self._start()
        self._wait_answering()
        self.running = True

    def stop(self, mode: StopMode = "fast") -> None:
        """``fast``: a clean shutdown that disconnects clients. ``immediate``: the
        server stops without a checkpoint and recovers at the next start, like a crash."""
        self._stop(mode)
        self.running = False

    def kill9(self) -> None:
        """SIGKILL the server and every process it started."""
        pids = self._server_pids()
        # Frozen first, so it cannot start another child between the listing and the kill.
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        everything = pids + [child for pid in pids for child in _children(pid)]
        for pid in everything:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _wait_gone(everything, f"{self.backend} after SIGKILL")
        self._after_kill()
        self.running = False

    def _after_kill(self) -> None:  # noqa: B027 - a hook; most servers need nothing
        """Clean up what a killed server leaves that would stop it from starting."""

    def restart(self, mode: StopMode | Literal["kill9"] = "fast", down_seconds: float = 0) -> None:
        if mode == "kill9":
            self.kill9()
        else:
            self.stop(mode)
        time.sleep(down_seconds)
        self.start()

    def create_database(self) -> None:
        engine = sa.create_engine(self.admin_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql(f"CREATE DATABASE {DATABASE}")
        finally:
            engine.dispose()

    def answers(self) -> str | None:
        """None if the server accepts a connection, else why not."""
        engine = sa.create_engine(self.admin_url, poolclass=NullPool)
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
        except Exception as exc:
            return " ".join(str(exc).split())[:300]
        finally:
            engine.dispose()
        return None

    def _wait_answering(self) -> None:
        deadline = time.monotonic() + SERVER_WAIT_SECONDS
        while (problem := self.answers()) is not None:
            if time.monotonic() > deadline or not self._server_pids():
                raise RuntimeError(
                    f"private {self.backend} server does not answer on port {self.port}: "
                    f"{problem}\n{_tail(self.log)}"
                )
            time.sleep(0.1)

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            if self._server_pids():
                self.stop("immediate")
        # Whatever a failed stop left behind must not outlive the test.
        with contextlib.suppress(Exception):
            if self._server_pids():
                self.kill9()
        shutil.rmtree(self.root, ignore_errors=True)


# -- PostgreSQL ----------------------------------------------------------------------------


def postgresql_bindir() -> Path:
    configured = os.environ.get("DBWORKER_TEST_PG_BINDIR")
    # A configured directory is the only candidate: no silent fallback to another one.
    candidates = [configured] if configured else []
    if not configured:
        on_path = shutil.which("initdb")
        if on_path:
            candidates.append(str(Path(on_path).parent))
        # Debian/Ubuntu keep the server programs off PATH; prefer the newest version.
        versions = glob.glob("/usr/lib/postgresql/*/bin")
        candidates += sorted(versions, key=lambda p: int(Path(p).parent.name), reverse=True)
    for candidate in candidates:
        bindir = Path(candidate)
        if all((bindir / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            return bindir
    where = (
        f"in DBWORKER_TEST_PG_BINDIR={configured}"
        if configured
        else "on PATH or in /usr/lib/postgresql/*/bin"
    )
    raise ServerUnavailable(f"no PostgreSQL server programs (initdb, pg_ctl, postgres) {where}")


class PostgreSQLServer(PrivateServer):
    backend = "postgresql"

    def __init__(self, root: Path, bindir: Path) -> None:
        super().__init__(root)
        self.bindir = bindir
        # The server must not run as root; hand the directory to postgres.
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            try:
                account = pwd.getpwnam("postgres")
            except KeyError:
                raise ServerUnavailable("running as root and no 'postgres' OS user") from None
            runuser = shutil.which("runuser")
            if runuser is None:
                raise ServerUnavailable("running as root and no runuser to drop to postgres")
            os.chown(root, account.pw_uid, account.pw_gid)
            self.as_user = [runuser, "-u", "postgres", "--"]

    def _url(self, database: str | None) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database or 'postgres'}"

    def _run(self, *command: str) -> None:
        result = subprocess.run(
            [*self.as_user, *command],
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=SERVER_WAIT_SECONDS,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}\n"
                f"{result.stderr}\n{_tail(self.log)}"
            )

    def initialize(self) -> None:
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )

    def _start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            # Durability is not under test and fsync makes a busy CI disk slower.
            "-c fsync=off -c max_connections=100"
        )
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "-t",
            str(int(SERVER_WAIT_SECONDS)),
            "start",
        )

    def _stop(self, mode: StopMode) -> None:
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-m",
            mode,
            "-w",
            "-t",
            str(int(SERVER_WAIT_SECONDS)),
            "stop",
        )

    def _server_pids(self) -> list[int]:
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return []
        return [pid] if pid_alive(pid) else []

    def _after_kill(self) -> None:
        # The killed postmaster is not our child (pg_ctl detaches it) and may stay a
        # zombie until something reaps it; PostgreSQL takes a zombie's pid in its
        # lock files (data directory, socket) for a live server and refuses to start.
        (self.data / "postmaster.pid").unlink(missing_ok=True)
        for leftover in (f".s.PGSQL.{self.port}.lock", f".s.PGSQL.{self.port}"):
            (self.root / leftover).unlink(missing_ok=True)


# -- MariaDB / MySQL -----------------------------------------------------------------------


def mariadb_programs() -> tuple[Path, Path]:
    """(server, install-db) programs."""
    configured = os.environ.get("DBWORKER_TEST_MARIADB_BINDIR")
    directories = (
        [configured]
        if configured
        else [os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin", "/usr/libexec"]
    )
    search = os.pathsep.join(directories)
    server = shutil.which("mariadbd", path=search) or shutil.which("mysqld", path=search)
    installer = shutil.which("mariadb-install-db", path=search) or shutil.which(
        "mysql_install_db", path=search
    )
    if server is None or installer is None:
        where = (
            f"in DBWORKER_TEST_MARIADB_BINDIR={configured}"
            if configured
            else "on PATH or in /usr/sbin, /usr/bin, /usr/libexec"
        )
        raise ServerUnavailable(
            f"no MariaDB server programs (mariadbd, mariadb-install-db) {where}"
        )
    return Path(server), Path(installer)


class MariaDBServer(PrivateServer):
    backend = "mysql"

    def __init__(self, root: Path, server: Path, installer: Path) -> None:
        super().__init__(root)
        self.server = server
        self.installer = installer
        self.socket = root / "mysqld.sock"
        self.pid_file = root / "mysqld.pid"
        # A starting mariadbd deletes every #sql file in its tmpdir: in the shared /tmp,
        # that would be the machine's server's temporary tables, in use by other tests.
        self.tmp = root / "tmp"
        self.process: subprocess.Popen[bytes] | None = None

    def _url(self, database: str | None) -> str:
        return f"mysql+mysqldb://root@127.0.0.1:{self.port}/{database or 'mysql'}"

    def initialize(self) -> None:
        # --no-defaults: the machine's my.cnf names the shared server's datadir,
        # port and socket, and must not leak into a private instance.
        self.tmp.mkdir(exist_ok=True)
        result = subprocess.run(
            [
                str(self.installer),
                "--no-defaults",
                f"--datadir={self.data}",
                f"--tmpdir={self.tmp}",
                "--auth-root-authentication-method=normal",
                "--user=root" if os.geteuid() == 0 else f"--user={pwd.getpwuid(os.geteuid())[0]}",
                "--skip-test-db",
            ],
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=SERVER_WAIT_SECONDS * 2,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{self.installer} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
            )

    def _start(self) -> None:
        user = "root" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid())[0]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    str(self.server),
                    "--no-defaults",
                    f"--datadir={self.data}",
                    f"--tmpdir={self.tmp}",
                    f"--port={self.port}",
                    "--bind-address=127.0.0.1",
                    f"--socket={self.socket}",
                    f"--pid-file={self.pid_file}",
                    f"--user={user}",
                    "--skip-log-bin",
                    "--innodb-buffer-pool-size=64M",
                    # Durability is not under test: no fsync per commit.
                    "--innodb-flush-log-at-trx-commit=2",
                ],
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own session: a signal meant for the test run must not reach it.
                start_new_session=True,
            )

    def _stop(self, mode: StopMode) -> None:
        # SIGTERM is MariaDB's clean shutdown (clients are disconnected); there is no
        # gentler "immediate" than a kill, so that is what immediate means here.
        if mode == "immediate":
            self.kill9()
            return
        process = self.process
        if process is None:
            return
        process.terminate()
        try:
            process.wait(SERVER_WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        self.process = None

    def kill9(self) -> None:
        super().kill9()
        if self.process is not None:
            self.process.wait()
            self.process = None

    def _server_pids(self) -> list[int]:
        if self.process is None or self.process.poll() is not None:
            return []
        return [self.process.pid]


# -- making one ----------------------------------------------------------------------------


def private_server(backend: str) -> PrivateServer:
    """A server of ``backend`` ("postgresql" or "mysql"): initialized, not started.

    Raises ServerUnavailable if this machine lacks the programs to run one.
    """
    if backend == "postgresql":
        bindir = postgresql_bindir()
        root = Path(tempfile.mkdtemp(prefix="dbworker-pg-"))
        try:
            server: PrivateServer = PostgreSQLServer(root, bindir)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
    elif backend == "mysql":
        programs = mariadb_programs()
        root = Path(tempfile.mkdtemp(prefix="dbworker-mariadb-"))
        server = MariaDBServer(root, *programs)
    else:
        raise ValueError(f"no private server for backend {backend!r}")
    try:
        server.initialize()
    except BaseException:
        server.destroy()
        raise
    return server


def start_private_server(backend: str) -> PrivateServer:
    """A running server of ``backend`` with an empty database ``ops``."""
    server = private_server(backend)
    try:
        server.start()
        server.create_database()
    except BaseException:
        server.destroy()
        raise
    return server
