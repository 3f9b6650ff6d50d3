"""A three-node MariaDB Galera cluster on loopback ports, in a temporary directory.

Each node is a ``mariadbd`` of its own (``--no-defaults``: nothing from /etc/mysql),
with its datadir, client port, Galera replication port, IST and SST ports; the first
bootstraps the cluster (``--wsrep-new-cluster``), the others join it and copy its data
with rsync (SST).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

from .processes import free_port, give_to, program, run, wait_for

USER = "mysql"
PROVIDERS = ("/usr/lib/galera/libgalera_smm.so", "/usr/lib/libgalera_smm.so")
#: dbworker's account on the cluster (created on the first node, replicated).
ACCOUNT = "dbworker"


def provider() -> str:
    for path in PROVIDERS:
        if os.path.exists(path):
            return path
    return program(PROVIDERS[0])  # raises TopologyUnavailable, naming the first


class GaleraNode:
    def __init__(self, root: Path, index: int) -> None:
        self.index = index
        self.dir = root / f"node{index}"
        self.data = self.dir / "data"
        # A starting mariadbd deletes every #sql file in its tmpdir: in the shared /tmp,
        # that would be the machine's server's temporary tables, in use by other tests.
        self.tmp = self.dir / "tmp"
        self.port = free_port()
        self.gcomm_port = free_port()
        self.ist_port = free_port()
        self.sst_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def install(self) -> None:
        self.data.mkdir(parents=True)
        self.tmp.mkdir()
        for path in (self.dir, self.data, self.tmp):
            give_to(USER, path)
        run([program("mariadb-install-db"), "--no-defaults", f"--user={USER}",
             f"--datadir={self.data}", f"--tmpdir={self.tmp}", "--skip-test-db",
             "--auth-root-authentication-method=socket"])  # fmt: skip

    def start(self, cluster: str, *, bootstrap: bool = False) -> None:
        argv = [
            program("/usr/sbin/mariadbd"), "--no-defaults", f"--user={USER}",
            f"--datadir={self.data}", f"--tmpdir={self.tmp}", f"--port={self.port}",
            "--bind-address=127.0.0.1",
            f"--socket={self.dir / 'mysqld.sock'}", f"--pid-file={self.dir / 'mysqld.pid'}",
            f"--log-error={self.dir / 'error.log'}", "--skip-name-resolve",
            # What Galera needs: row-based replication, interleaved auto-increments, InnoDB.
            "--binlog-format=ROW", "--innodb-autoinc-lock-mode=2",
            "--default-storage-engine=InnoDB", "--innodb-flush-log-at-trx-commit=0",
            "--innodb-buffer-pool-size=64M", "--max-connections=300",
            "--wsrep-on=ON", f"--wsrep-provider={provider()}",
            f"--wsrep-cluster-address={cluster}", "--wsrep-cluster-name=dbworker",
            f"--wsrep-node-name=node{self.index}",
            f"--wsrep-node-address=127.0.0.1:{self.gcomm_port}",
            f"--wsrep-provider-options=gmcast.listen_addr=tcp://127.0.0.1:{self.gcomm_port};"
            f"ist.recv_addr=127.0.0.1:{self.ist_port};gcache.size=64M",
            "--wsrep-sst-method=rsync", f"--wsrep-sst-receive-address=127.0.0.1:{self.sst_port}",
            "--wsrep-slave-threads=2",
        ]  # fmt: skip
        if bootstrap:
            argv.append("--wsrep-new-cluster")
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.synced, f"galera node{self.index}", timeout=120)

    def root_url(self) -> str:
        return f"mysql+pymysql://root@localhost/?unix_socket={self.dir / 'mysqld.sock'}"

    def url(self, database: str) -> str:
        return f"mysql+mysqldb://{ACCOUNT}:{ACCOUNT}@127.0.0.1:{self.port}/{database}"

    def synced(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"galera node{self.index} exited: {self.error_log()[-2000:]}")
        engine = sa.create_engine(self.root_url(), poolclass=sa.pool.NullPool)
        try:
            with engine.connect() as conn:
                state = conn.exec_driver_sql("SHOW STATUS LIKE 'wsrep_local_state_comment'").one()
            return bool(state[1] == "Synced")
        except Exception:
            return False
        finally:
            engine.dispose()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def error_log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.dir / "error.log").read_text(errors="replace")
        return ""


class Galera:
    """Three nodes; ``nodes[i].url(database)`` is a client URL of node i."""

    def __init__(self, size: int = 3, database: str = "dbworker") -> None:
        program("mariadbd") if shutil.which("mariadbd") else program("/usr/sbin/mariadbd")
        program("mariadb-install-db")
        program("rsync")
        provider()
        self.root = Path(tempfile.mkdtemp(prefix="dbworker-galera-"))
        self.root.chmod(0o755)
        self.database = database
        self.nodes = [GaleraNode(self.root, i) for i in range(1, size + 1)]
        try:
            self.nodes[0].install()
            self.nodes[0].start(self.cluster_address(), bootstrap=True)
            engine = sa.create_engine(self.nodes[0].root_url(), poolclass=sa.pool.NullPool)
            with engine.begin() as conn:
                for statement in (
                    f"CREATE USER '{ACCOUNT}'@'%%' IDENTIFIED BY '{ACCOUNT}'",
                    f"GRANT ALL ON *.* TO '{ACCOUNT}'@'%%' WITH GRANT OPTION",
                    f"CREATE DATABASE {database}",
                ):
                    conn.exec_driver_sql(statement)
            engine.dispose()
            for node in self.nodes[1:]:
                node.install()
                node.start(self.cluster_address())
        except BaseException:
            self.stop()
            raise

    def cluster_address(self) -> str:
        return "gcomm://" + ",".join(f"127.0.0.1:{node.gcomm_port}" for node in self.nodes)

    def size(self) -> int:
        """The cluster size a live node reports."""
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None:
                engine = sa.create_engine(node.root_url(), poolclass=sa.pool.NullPool)
                try:
                    with engine.connect() as conn:
                        row = conn.exec_driver_sql("SHOW STATUS LIKE 'wsrep_cluster_size'").one()
                    return int(row[1])
                except Exception:
                    continue
                finally:
                    engine.dispose()
        return 0

    def restart(self, node: GaleraNode) -> None:
        """Start a killed node again: it rejoins (IST or SST) and is synced on return."""
        node.start(self.cluster_address())

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.kill()
        time.sleep(0.1)
        shutil.rmtree(self.root, ignore_errors=True)
