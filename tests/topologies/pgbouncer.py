"""A PgBouncer in transaction pooling mode in front of a PostgreSQL server."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from pathlib import Path

from sqlalchemy.engine import URL, make_url

from .processes import free_port, give_to, listening, program, wait_for

PGBOUNCER = "/usr/sbin/pgbouncer"
#: Each routed URL handed out, and the URL of the server itself (for ``listen_url``).
DIRECT: dict[str, str] = {}
#: The unprivileged user PgBouncer runs as when the tests run as root.
USER = "postgres"


class PgBouncer:
    """``pool_mode = transaction`` on a free port, forwarding every database name to
    ``server`` (its host, port, user and password): a client's transactions go to any
    of the pool's server connections, as in production."""

    def __init__(self, server: URL, pool_size: int = 40) -> None:
        self.server = server
        self.port = free_port()
        self._dir = Path(tempfile.mkdtemp(prefix="dbworker-pgbouncer-"))
        self._dir.chmod(0o755)
        login = f"user={server.username or 'postgres'}"
        if server.password:
            login += f" password={server.password}"
        (self._dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={server.host or '127.0.0.1'} port={server.port or 5432} {login}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = any\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            "max_client_conn = 1000\n"
            # A server connection is given back after every transaction; nothing resets
            # it (transaction mode runs no server_reset_query), as in production.
            "server_check_delay = 0\n"
            f"logfile = {self._dir / 'pgbouncer.log'}\n"
            f"pidfile = {self._dir / 'pgbouncer.pid'}\n"
            "ignore_startup_parameters = extra_float_digits\n"
        )
        give_to(USER, self._dir)
        argv = [program(PGBOUNCER), str(self._dir / "pgbouncer.ini")]
        if os.geteuid() == 0:
            argv[1:1] = ["-u", USER]  # it refuses to run as root
        self._process = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for(lambda: listening(self.port), "pgbouncer", timeout=30)
        except BaseException:
            self.stop()
            raise

    def route(self, url: str, *, plugin: bool = True) -> str:
        """``url``'s database through this PgBouncer; with ``plugin``, marked pooled
        (``?plugin=dbworker_pooled``), as the documentation tells applications to."""
        parsed = make_url(url).set(host="127.0.0.1", port=self.port)
        if plugin:
            parsed = parsed.update_query_dict({"plugin": "dbworker_pooled"})
        routed = parsed.render_as_string(hide_password=False)
        DIRECT[routed] = url
        return routed

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self._dir / "pgbouncer.log").read_text()
        return ""

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGINT)  # shut down at once
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()


def listen_url(url: str) -> str | None:
    """The direct URL a coordinator on routed ``url`` listens on (None: not routed)."""
    return DIRECT.get(url)
