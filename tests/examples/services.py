"""Running an example's services as real processes, as their READMEs do."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx

from waiting import wait_until

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example_env(**values: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(values)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(EXAMPLES), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Process:
    def __init__(self, argv: Sequence[str], env: Mapping[str, str], log: Path, **kw: object):
        self.log = log
        self._out = log.open("wb")
        self.popen = subprocess.Popen(
            list(argv),
            cwd=EXAMPLES,
            env=dict(env),
            stdout=self._out,
            stderr=subprocess.STDOUT,
            **kw,  # type: ignore[call-overload]
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM, as a service manager would; the exit status (killed if it hangs)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            status: int = self.popen.wait(timeout)
            return status
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            raise AssertionError(f"{self.popen.args} ignored SIGTERM:\n{self.output()}") from None
        finally:
            self._out.close()


@contextlib.contextmanager
def api_service(app: str, env: Mapping[str, str], log: Path) -> Iterator[httpx.Client]:
    """uvicorn serving ``app`` on a socket bound here (no port race), and a client."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    argv = [sys.executable, "-m", "uvicorn", app, "--fd", str(sock.fileno())]
    process = Process(argv, env, log, pass_fds=[sock.fileno()])
    sock.close()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:

            def up() -> bool:
                if process.popen.poll() is not None:
                    raise AssertionError(f"the API exited:\n{process.output()}")
                try:
                    return client.get("/health").status_code == 200
                except httpx.TransportError:
                    return False

            wait_until(up, "the API to answer", interval=0.1)
            yield client
    except BaseException:
        process.terminate()
        raise
    status = process.terminate()
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal (so its own
    # parent sees how it ended): -SIGTERM is its clean exit.
    assert status in (0, -signal.SIGTERM), f"uvicorn exited with {status}:\n{process.output()}"
