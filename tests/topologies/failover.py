"""A PostgreSQL primary and its streaming replica (asynchronous), built with initdb and
``pg_basebackup -R`` in a temporary directory, for failover tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from .processes import as_user, free_port, give_to, listening, program, run, wait_for

BIN = Path(os.environ.get("DBWORKER_PG_BIN", "/usr/lib/postgresql/15/bin"))
USER = "postgres"


def _bin(name: str) -> str:
    return program(str(BIN / name))


class Node:
    def __init__(self, root: Path, name: str) -> None:
        self.data = root / name
        self.port = free_port()
        self.log = root / f"{name}.log"

    def start(self) -> None:
        run(
            as_user(
                USER,
                [
                    _bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                    "-o", f"-p {self.port} -k {self.data.parent} -c listen_addresses=127.0.0.1",
                    "start",
                ],
            )
        )  # fmt: skip
        wait_for(lambda: listening(self.port), f"postgres on {self.port}")

    def kill(self) -> None:
        """Stop at once, as a crash would (no shutdown checkpoint, no WAL sent on)."""
        run(as_user(USER, [_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"]))

    def promote(self) -> None:
        run(as_user(USER, [_bin("pg_ctl"), "-D", str(self.data), "-w", "promote"]))

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(Exception):
                self.kill()


class Failover:
    """``primary`` streams to ``replica``; ``url`` names both, read-write first."""

    def __init__(self, database: str = "dbworker") -> None:
        for name in ("initdb", "pg_ctl", "pg_basebackup"):
            _bin(name)
        self.root = Path(tempfile.mkdtemp(prefix="dbworker-failover-"))
        give_to(USER, self.root)
        self.database = database
        self.primary = Node(self.root, "primary")
        self.replica = Node(self.root, "replica")
        try:
            run(
                as_user(
                    USER,
                    [_bin("initdb"), "-D", str(self.primary.data), "-U", "postgres",
                     "--auth=trust", "--no-sync"],
                )
            )  # fmt: skip
            with (self.primary.data / "postgresql.conf").open("a") as conf:
                # Fast to build and to recover: no fsync, as in the other test servers.
                conf.write("fsync = off\nwal_level = replica\nmax_wal_senders = 5\n")
            self.primary.start()
            run(
                as_user(
                    USER,
                    [_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.primary.port),
                     "-U", "postgres", "-D", str(self.replica.data), "-R", "-X", "stream"],
                )
            )  # fmt: skip
            self.replica.start()
            run(
                as_user(
                    USER,
                    [_bin("psql"), "-h", "127.0.0.1", "-p", str(self.primary.port), "-U",
                     "postgres", "-c", f"CREATE DATABASE {database}"],
                )
            )  # fmt: skip
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        """Both servers; libpq connects to the first that accepts writes."""
        return (
            f"postgresql+psycopg://postgres@/{self.database}"
            f"?host=127.0.0.1:{self.primary.port}&host=127.0.0.1:{self.replica.port}"
            "&target_session_attrs=read-write&connect_timeout=2"
        )

    def stop(self) -> None:
        self.replica.stop()
        self.primary.stop()
        shutil.rmtree(self.root, ignore_errors=True)
