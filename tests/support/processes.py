"""The project's real server processes, for tests and benchmarks: a Celery worker, daphne (and how to launch Chromium).

Each runs in its own process group, so `kill()` takes it down whole (SIGKILL, as a crash
or an OOM kill would) and `stop()` asks politely first. The caller passes the environment
(which database, which Redis) and a log file; `wait_ready()` fails with the log's tail.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from dashboard.processes import WEB_THREADS, listen_endpoint

ROOT = Path(__file__).resolve().parents[2]

# Debian's Chromium, driven by Playwright (never a browser Playwright downloads). Without the
# background-networking flags it keeps trying hosts a closed network refuses.
CHROMIUM = Path(os.environ.get("AGENTFAST_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """A long-running child process of the project; subclasses say how to tell it is ready."""

    name = "process"

    def __init__(self, args: list[str], *, log: Path, env: dict[str, str]) -> None:
        self.args, self.log_path, self.env = args, log, {**env, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.args,
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def is_ready(self) -> bool:
        raise NotImplementedError

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.alive:
            if self.is_ready():
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not start:\n{self.log_tail()}")

    def ensure_running(self, timeout: float = 20) -> None:
        """Start the process again if it died (or a test killed it), and wait until it is ready."""
        if not self.alive:
            self.start()
        self.wait_ready(timeout=timeout)

    def log_tail(self, chars: int = 3000) -> str:
        """Return the end of the process's log, for a failure message."""
        return self.log_path.read_text(errors="replace")[-chars:]

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group at once."""
        if self.alive:
            assert self.process is not None
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM the process group; SIGKILL it if it lingers."""
        if not self.alive:
            return
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()


class Worker(ServerProcess):
    """`celery worker --pool=solo`, optionally with the beat sweeper embedded."""

    name = "celery worker"

    def __init__(self, *, log: Path, env: dict[str, str], beat: bool = False) -> None:
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "dashboard",
            "worker",
            "--pool=solo",
            "--loglevel=INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        if beat:
            args += ["--beat", "--schedule", str(log.with_suffix(".beat"))]
        super().__init__(args, log=log, env=env)
        self.start()

    def is_ready(self) -> bool:
        return b" ready." in self.log_path.read_bytes()


class Daphne(ServerProcess):
    """`daphne dashboard.asgi:application` on a free port, restartable on the same port."""

    name = "daphne"

    def __init__(self, *, log: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        endpoint = listen_endpoint("127.0.0.1", self.port)  # as `agentfast serve` listens
        args = [sys.executable, "-m", "daphne", "-e", endpoint, "dashboard.asgi:application"]
        # And with its threads for sync work (Python's default, cpus + 4, is 6 on 2 cores): a hundred
        # long polls each reread the database on them.
        super().__init__(args, log=log, env={"ASGI_THREADS": str(WEB_THREADS), **env})

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False


class CliServe(Daphne):
    """`agentfast serve` (daphne as the command starts it) on a free port; `wrap` goes before the command."""

    def __init__(self, *, log: Path, env: dict[str, str], wrap: tuple[str, ...] = ()) -> None:
        super().__init__(log=log, env=env)
        self.args = [*wrap, sys.executable, "-m", "dashboard.cli", "serve", "--port", str(self.port)]
