"""Django settings for agentfast, read from the environment.

Defaults give a working single machine with nothing installed: SQLite in `var/` and the
embedded Redis. Production sets DATABASE_URL and REDIS_URL.
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import os
import re
import secrets
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import environ
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured
from django.core.management.utils import get_random_secret_key

from dashboard import processes as embedded_redis

env = environ.Env()
_Num = TypeVar("_Num", int, float)
BASE_DIR = Path(__file__).resolve().parent.parent
# A value of blanks only (an env file's `NAME= `) counts as unset, as for every other variable.
VAR_DIR = Path(env.str("AGENTFAST_VAR_DIR", default="").strip() or BASE_DIR / "var").resolve()


def _number(name: str, parse: Callable[[str], _Num], what: str) -> tuple[str, _Num] | None:
    """Return a numeric variable as written and as read, or None when unset; malformed stops the process."""
    raw = env.str(name, default="").strip()
    if not raw:
        return None
    try:
        return raw, parse(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}: {raw!r} is not {what}") from None


def _int(name: str, default: int, *, minimum: int, maximum: int | None = None) -> int:
    """Read a whole-number setting; a malformed or out-of-range value stops the process, naming it."""
    found = _number(name, int, "a whole number")
    if found is None:
        return default
    raw, value = found
    if value < minimum or (maximum is not None and value > maximum):
        upper = f"; at most {maximum}" if maximum is not None else ""
        raise ImproperlyConfigured(f"{name}: {raw!r} is out of range (at least {minimum}){upper}")
    return value


def _float(name: str, default: float, *, zero: bool, minimum: float = 0.0, maximum: float | None = None) -> float:
    """Read a duration setting: NaN, infinity, a negative value, 0 unless `zero`, a value under `minimum`
    (other than that 0) or over `maximum` stops the process."""
    found = _number(name, float, "a number")
    if found is None:
        return default
    raw, value = found
    too_small = value < 0 or (value == 0 and not zero) or (value != 0 and value < minimum)
    if not math.isfinite(value) or too_small or (maximum is not None and value > maximum):
        bound = f"of at least {minimum:g}" if minimum else "0 or more" if zero else "above 0"
        upper = f"; at most {maximum:g}" if maximum is not None else ""
        raise ImproperlyConfigured(f"{name}: {raw!r} is out of range (a finite number {bound}){upper}")
    return value


# The longest duration, in seconds, the engine's leases, sweeps and model timeouts take: a week.
# Far longer ones started, then failed every drive or sweep (a date past year 9999, a socket
# timeout past what the system holds), so no run moved again.
_ENGINE_SECONDS_MAX = 7 * 24 * 3600.0
# The shortest: a lease (or a claim, a model's whole turn) under a second is lost between its
# renewals under any load, and a sweep or a timeout of a nanosecond (1e-9, a typo for 1e9) would
# spin beat or fail every request at once.
_ENGINE_SECONDS_MIN = 1.0
_TIMEOUT_SECONDS_MIN = 0.1


def _log_level(name: str, default: str) -> str:
    """Read a log level, in any case; anything but a level's name stops the process, naming the variable."""
    raw = env.str(name, default="").strip()
    if not raw:
        return default
    if raw.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ImproperlyConfigured(f"{name}: {raw!r} is not a log level (DEBUG, INFO, WARNING, ERROR or CRITICAL)")
    return raw.upper()


_ON = ("1", "true", "yes", "on", "y", "ok")
_OFF = ("0", "false", "no", "off", "n")


def _bool(name: str, default: bool) -> bool:
    """Read a switch; unset or empty is the default, anything but on or off stops the process, naming it.

    django-environ reads any unknown word as off: `DJANGO_SESSION_COOKIE_SECURE=ture` would
    send session cookies in the clear and say nothing.
    """
    raw = env.str(name, default="").strip()
    if not raw:
        return default
    if raw.lower() not in _ON + _OFF:
        raise ImproperlyConfigured(f"{name}: {raw!r} is not on or off (1, true, yes, on / 0, false, no, off)")
    return raw.lower() in _ON


def _secret(name: str) -> str:
    """Read a secret; one of blanks only (an env file's `NAME= `) counts as unset, never as the secret."""
    return env.str(name, default="").strip()


def _http_url(name: str, default: str) -> str:
    """Read the site's own http(s) URL (links in mails and chat start with it), without a trailing slash."""
    raw = env.str(name, default="").strip() or default
    if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", raw):
        raise ImproperlyConfigured(f"{name}: {raw!r} is not an http(s) URL (like https://agentfast.example.com)")
    return raw.rstrip("/")


def _private_dir(path: Path) -> Path:
    """Create the folder readable by this user only (it holds the database and the secret key).

    A command that works only on what is already there (the CLI sets AGENTFAST_VAR_DIR_MUST_EXIST
    for all but `dev`, `serve` and `worker`) stops instead when AGENTFAST_VAR_DIR names a folder
    that does not exist: in a mistyped one it would find a new, empty database and a new secret
    key, and say nothing. The default folder (var/ in the project) is created as ever.

    A folder already private is left as it is: on a read-only file system (a container's, with
    var/ made when the image was built) or owned by another user, changing its mode fails.
    """
    named = bool(env.str("AGENTFAST_VAR_DIR", default="").strip())
    if named and env.bool("AGENTFAST_VAR_DIR_MUST_EXIST", default=False) and not path.is_dir():
        raise ImproperlyConfigured(
            f"AGENTFAST_VAR_DIR: the folder {path} does not exist; is the variable mistyped?"
            " (`agentfast dev` or `manage.py migrate` creates it)"
        )
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if path.stat().st_mode & 0o077:
            path.chmod(0o700)
    except OSError as exc:
        raise ImproperlyConfigured(
            f"AGENTFAST_VAR_DIR: the folder {path} cannot be made private to this user ({exc.strerror});"
            " `chmod 700` it, or name a folder of this user's"
        ) from None
    return path


def _private_file(path: Path) -> None:
    """Create the file (if missing) and its SQLite companions readable by this user only."""
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    # SQLite gives the -wal and -shm files the database file's mode; tighten leftovers.
    for each in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if each.exists():
            each.chmod(0o600)


# The key file holds a key this module made (50 characters); anything much shorter was not.
MIN_STORED_KEY_CHARS = 32


def _secret_key(path: Path) -> str:
    """Return DJANGO_SECRET_KEY, else the key in var/secret_key, generated once (0600)."""
    explicit = _secret("DJANGO_SECRET_KEY")
    if explicit:
        return explicit
    try:
        key = _stored_secret_key(path)
    except OSError as exc:
        raise ImproperlyConfigured(
            f"DJANGO_SECRET_KEY: unset, and the key file {path} cannot be made or read ({exc.strerror});"
            " set the variable (every process the same)"
        ) from None
    if len(key) < MIN_STORED_KEY_CHARS:
        # Made by hand (`touch`) or cut short: an empty key answers 500 to every page, a short one is guessed.
        raise ImproperlyConfigured(
            f"DJANGO_SECRET_KEY: unset, and the key file {path} holds {len(key)} characters, not a key;"
            " delete the file to have one made, or set the variable (every process the same)"
        )
    return key


def _stored_secret_key(path: Path) -> str:
    """Return the key in the file, generated once (0600)."""
    if not path.exists():
        draft = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
        descriptor = os.open(draft, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(get_random_secret_key())
        try:
            # link() never replaces: when web, worker and beat start together, the first key wins.
            os.link(draft, path)
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    return path.read_text().strip()


_SQLITE = "django.db.backends.sqlite3"
_POSTGRES = "django.db.backends.postgresql"
_DATABASE_URLS = "postgres://user:pass@host:5432/db or sqlite:////path/to/file.sqlite3"


def _database(url: str) -> dict[str, object]:
    """Return the DATABASES entry for DATABASE_URL (postgres://… or sqlite:////path); SQLite in var/ if unset."""
    config = _database_config(url or f"sqlite:///{VAR_DIR / 'agentfast.sqlite3'}")
    if config["ENGINE"] == _SQLITE:
        return _sqlite(Path(config["NAME"]))
    return _postgres(config)


def _database_config(url: str) -> dict[str, Any]:
    """Read a database URL; one that names no PostgreSQL database or SQLite file stops the process.

    Messages name the scheme at most, never the URL: it may hold a password.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # django-environ warns of a URL it cannot read; refused below
        try:
            config = env.db_url_config(url)
        except ValueError as exc:  # a port that is not a number
            raise ImproperlyConfigured(f"DATABASE_URL: {exc} ({_DATABASE_URLS})") from None
    engine = config.get("ENGINE")
    if not engine:
        raise ImproperlyConfigured(f"DATABASE_URL: not a database URL (use {_DATABASE_URLS})")
    if engine not in (_SQLITE, _POSTGRES):
        raise ImproperlyConfigured(f"DATABASE_URL: unsupported database {engine!r} (use postgres:// or sqlite://)")
    if engine == _POSTGRES and not config.get("NAME"):
        raise ImproperlyConfigured(f"DATABASE_URL: names no database after the host (use {_DATABASE_URLS})")
    if engine == _SQLITE and config.get("NAME") in ("", ":memory:"):
        # Each process would have a database of its own in memory: web, worker and CLI never meet.
        raise ImproperlyConfigured(f"DATABASE_URL: names no SQLite file (use {_DATABASE_URLS})")
    return config


# -- throughput: database connections per process (issue 12) -----------------------------------
# A worker drives many runs at once on threads (dashboard/processes.py). A thread takes a
# connection from this bounded pool only while it reads or writes a step and hands it back while
# the model thinks or a tool runs (agents.runtime.execution), so 100 threads share a few
# connections; one finding the pool empty waits (up to `timeout`). The server's max_connections
# (or a pooler such as PgBouncer in transaction mode) must exceed the sum over every process.
# AGENTFAST_DB_POOL=0 turns it off (persistent connections per thread instead, as before).
DB_POOL_SIZE = _int("AGENTFAST_DB_POOL", 20, minimum=0)
# Prepared statements (AGENTFAST_DB_PREPARED=on): PostgreSQL parses and plans a statement a
# connection runs again and again once, not at every run. psycopg prepares statements only with
# parameters bound on the server (Django's default binds them in the client, into SQL text that is
# new each time), and here from a statement's second run on a connection (at psycopg's default,
# its sixth, the round trip below was no faster than without; not traced further). The engine's
# hot statements are few and repeated: its in-process round trip took 10.8–12.7 ms instead of
# 13.4–14.4 (`bench.compare`). Off by default, for two reasons: a pooler in transaction mode must
# keep them (PgBouncer 1.21 or later with max_prepared_statements set), and a migration that
# changes the type of a column a prepared statement reads makes that statement fail on its
# connection until the process restarts ("cached plan must not change result type": psycopg keeps
# running the stale one), where client-bound SQL would go on working.
DB_PREPARED = _bool("AGENTFAST_DB_PREPARED", False)


def _postgres(config: dict[str, object]) -> dict[str, object]:
    # A server-side cursor (QuerySet.iterator() outside a transaction) outlives its transaction,
    # which a pooler in transaction mode (PgBouncer, as the README suggests) does not keep: off,
    # as Django's docs say for such a pooler. Long reads go by keyset pages instead (audit_verify).
    config = {**config, "DISABLE_SERVER_SIDE_CURSORS": True}
    options = dict(config.get("OPTIONS") or {})  # type: ignore[call-overload]
    options["server_side_binding"] = DB_PREPARED
    if DB_PREPARED:
        options["prepare_threshold"] = 1
    config = {**config, "OPTIONS": options}
    if DB_POOL_SIZE <= 0:
        return {**config, "CONN_MAX_AGE": 60, "CONN_HEALTH_CHECKS": True}
    # Connections open on demand up to max_size; a thread waits up to `timeout` s for one.
    options["pool"] = {"min_size": min(2, DB_POOL_SIZE), "max_size": DB_POOL_SIZE, "timeout": 30}
    # The pool keeps the connections: Django must not hold one per thread past a request or task.
    return {**config, "OPTIONS": options, "CONN_MAX_AGE": 0}


# Threads of a web process that serve sync views side by side, middleware and all
# (dashboard.threaded); each keeps its own database connection between requests. 0 leaves
# them to Django's ASGI handler (a new thread per request, a hop per middleware hook).
AGENTFAST_WEB_THREADS = _int("AGENTFAST_WEB_THREADS", 8, minimum=0)

# -- end throughput ---------------------------------------------------------------------------------


def _sqlite(path: Path) -> dict[str, object]:
    path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    # The file holds session keys and token hashes: this user only.
    _private_file(path)
    # WAL lets readers run beside the one writer; IMMEDIATE takes the write lock at BEGIN,
    # so two processes racing on a compare-and-set queue up instead of failing with
    # "database is locked" when a DEFERRED reader tries to upgrade.
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": path,
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
        "TEST": {"NAME": str(path.with_name(f"test_{path.stem}.sqlite3"))},
        # Keep the connection (and its PRAGMAs) across a worker's tasks.
        "CONN_MAX_AGE": 600,
    }


def _celery_url(redis_url: str) -> str:
    # redis-py spells a unix socket unix://, kombu spells it redis+socket://.
    if redis_url.startswith("unix://"):
        return "redis+socket://" + redis_url.removeprefix("unix://")
    return redis_url


def _redis_url(name: str, url: str) -> str:
    """Return a Redis URL as given; anything but redis://, rediss:// or unix:// stops the process, naming it."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ImproperlyConfigured(f"{name}: {url!r} is not a Redis URL (redis://host:6379/0, rediss://… or unix://…)")
    return url


def _list(name: str, default: list[str]) -> list[str]:
    """Return a comma-separated variable as a list, blanks around items and empty items dropped."""
    return [item.strip() for item in env.list(name, default=default) if item.strip()]


def _hosts(name: str, default: list[str]) -> list[str]:
    """Return the host names listed in the variable (empty: the default), refusing one no Host header can match."""
    values = _list(name, []) or default
    for value in values:
        if re.search(r"[\s/]|://", value):
            raise ImproperlyConfigured(
                f"{name}: {value!r} is not a host name (comma-separated names like agentfast.example.com, no scheme)"
            )
    return values


def _networks(name: str) -> list[str]:
    """Return the IPs or CIDRs listed in the variable, refusing anything else."""
    values = _list(name, [])
    for value in values:
        try:
            ipaddress.ip_network(value, strict=False)
        except ValueError:
            raise ImproperlyConfigured(f"{name}: {value!r} is not an IP address or network") from None
    return values


def _proxy_ssl_header(value: str) -> tuple[str, str] | None:
    """Parse "X-Forwarded-Proto: https" into Django's SECURE_PROXY_SSL_HEADER."""
    if not value:
        return None
    header, colon, expected = value.partition(":")
    if not colon or not header.strip() or not expected.strip():
        raise ImproperlyConfigured(f"DJANGO_SECURE_PROXY_SSL_HEADER: {value!r} is not like 'X-Forwarded-Proto: https'")
    name = header.strip().upper().replace("-", "_")
    # Django's own spelling (HTTP_X_FORWARDED_PROTO) names the same header: never prefix it twice.
    return (name if name.startswith("HTTP_") else "HTTP_" + name), expected.strip()


_private_dir(VAR_DIR)

# Off unless a developer opts in: a debug page shows settings to anyone who can make an error.
DEBUG = _bool("DJANGO_DEBUG", False)
SECRET_KEY = _secret_key(VAR_DIR / "secret_key")
ALLOWED_HOSTS = _hosts("DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
# Addresses of the reverse proxies whose X-Forwarded-For is believed (IPs or CIDRs).
AGENTFAST_TRUSTED_PROXIES = _networks("AGENTFAST_TRUSTED_PROXIES")

# Not daphne's app: it only swaps `runserver` for daphne's (the project serves with `agentfast
# serve`), and importing it installs Twisted's reactor in every process that loads Django,
# about a quarter of a second of each CLI command and worker start.
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "axes",
    "csp",
    "ninja",  # serves /api/docs' Swagger UI from its own static files, not a CDN
    "agents",
    "dashboard",
]

MIDDLEWARE = [
    # First: /healthz and /metrics answer a probe of this process's own address, over plain HTTP.
    "dashboard.middleware.ProbeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "dashboard.middleware.StaticFilesMiddleware",  # WhiteNoise's, async-capable
    # A query parameter that is not UTF-8 is a 400 naming it, before any page or endpoint reads it as U+FFFD.
    "dashboard.middleware.QueryTextMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "dashboard.middleware.ContentSecurityPolicyMiddleware",
    "dashboard.middleware.NoStoreMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes asks: it turns a locked-out sign-in into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "dashboard.urls"
WSGI_APPLICATION = None
ASGI_APPLICATION = "dashboard.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": _database(env.str("DATABASE_URL", default=""))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
    {"NAME": "agents.services.users.NotBlankPasswordValidator"},  # eight spaces pass the four above
]
AUTHENTICATION_BACKENDS = [
    # django-axes first: it refuses a locked-out username+address before any password check.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"
with contextlib.suppress(OSError):  # a read-only var/: WhiteNoise warns, nothing else needs it
    STATIC_ROOT.mkdir(exist_ok=True)  # WhiteNoise warns at every start without it
# Serve static files straight from the app folders: `make run` needs no collectstatic.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# Bodies larger than this are refused before any JSON parsing (the API, forms).
DATA_UPLOAD_MAX_MEMORY_SIZE = 256 * 1024
CSRF_TRUSTED_ORIGINS = _list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

# Failed sign-ins: after AXES_FAILURE_LIMIT wrong passwords for one user name from one
# address, that pair is refused until the cool-off has passed (the database counts, so
# every web process agrees). The address is the audit's (trusted proxies only).
AXES_FAILURE_LIMIT = _int("AGENTFAST_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=_float("AGENTFAST_LOGIN_COOLOFF_MINUTES", 15, zero=False))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "dashboard.auth.client_address"
AXES_USERNAME_CALLABLE = "dashboard.auth.login_username"
AXES_LOCKOUT_CALLABLE = "dashboard.auth.locked_out"
AXES_VERBOSE = False

# HTTPS: behind a TLS-terminating proxy set these (see the README's Production section).
SESSION_COOKIE_SECURE = _bool("DJANGO_SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = _bool("DJANGO_CSRF_COOKIE_SECURE", False)
SECURE_SSL_REDIRECT = _bool("DJANGO_SECURE_SSL_REDIRECT", False)
SECURE_PROXY_SSL_HEADER = _proxy_ssl_header(env.str("DJANGO_SECURE_PROXY_SSL_HEADER", default=""))
SECURE_HSTS_SECONDS = _int("DJANGO_SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = _bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = _bool("DJANGO_SECURE_HSTS_PRELOAD", False)
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

# No inline script anywhere: a script that slips into a page through stored text cannot run.
# The websocket origin is added to connect-src per request (dashboard.middleware).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF, "'unsafe-inline'"],
        "img-src": [SELF, "data:"],
        "connect-src": [SELF],
        "font-src": [SELF],
        "frame-ancestors": [NONE],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
    }
}

# An empty REDIS_URL means unset, like no REDIS_URL at all: the embedded Redis under var/.
_EXPLICIT_REDIS_URL = env.str("REDIS_URL", default="").strip()
if _EXPLICIT_REDIS_URL:
    _redis_url("REDIS_URL", _EXPLICIT_REDIS_URL)
REDIS_IS_EMBEDDED = not _EXPLICIT_REDIS_URL
REDIS_URL = _EXPLICIT_REDIS_URL or embedded_redis.url(embedded_redis.socket_path(VAR_DIR))

# Django's cache is Redis, so what it counts (the Slack refusals audited once a minute a
# sender) holds for every web process, not each one apart; "local" is this process's memory,
# for when Redis does not answer. Short timeouts: a request must not wait long on Redis.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "agentfast",
        "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
    },
    "local": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
}

# Redis pub/sub: a group send is one PUBLISH. Nothing is queued for a viewer who is away;
# viewers catch up from RunEvent rows (SSE replay, the inbox's re-sync).
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": env.str("AGENTFAST_CHANNEL_LAYER", default="channels_redis.pubsub.RedisPubSubChannelLayer"),
        "CONFIG": {"hosts": [{"address": REDIS_URL}]},
    }
}
# -- live connections (h4): extra channel-layer Redis hosts, body and stream limits ------
# Several hosts shard the groups (comma-separated Redis URLs; REDIS_URL stays the first).
AGENTFAST_CHANNEL_HOSTS = [_redis_url("AGENTFAST_CHANNEL_HOSTS", u) for u in _list("AGENTFAST_CHANNEL_HOSTS", [])]
CHANNEL_LAYERS["default"]["CONFIG"]["hosts"] += [{"address": u} for u in AGENTFAST_CHANNEL_HOSTS]
# A request body over this is refused (413) before it is read; forms get the headroom.
AGENTFAST_MAX_BODY_BYTES = _int("AGENTFAST_MAX_BODY_BYTES", DATA_UPLOAD_MAX_MEMORY_SIZE + 64 * 1024, minimum=1024)
# Open SSE streams per user and process; one more is refused (429).
AGENTFAST_STREAMS_PER_USER = _int("AGENTFAST_STREAMS_PER_USER", 20, minimum=1)
AGENTFAST_WAITS_PER_USER = _int("AGENTFAST_WAITS_PER_USER", 100, minimum=1)
# -- end of live connections --------------------------------------------------------------

# Celery: every task step is a compare-and-set, so late acks and redelivery are safe.
CELERY_BROKER_URL = _celery_url(REDIS_URL)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A worker keeps trying to reach Redis however long it is away (Celery gives up after 100
# tries, about 50 minutes, and exits; nothing under `make run` would start it again).
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
# A publish must fail fast when Redis is down: the decision is already committed and the
# sweeper will enqueue it later (Redis is never the source of truth). Not retrying the publish
# is not enough: kombu also retried the connection under it, sleeping 2 s then 4 s, so each
# decision and new run took over 6 s to answer. `max_retries` 0 is that connection's alone;
# a worker's consumer reconnects with CELERY_BROKER_CONNECTION_MAX_RETRIES, for ever.
CELERY_TASK_PUBLISH_RETRY = False
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "socket_connect_timeout": 2,
    "socket_timeout": 5,
    "visibility_timeout": 3600,
    "max_retries": 0,
}
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# New runs queue behind decided ones: Redis hands out priority 0 first (kombu's steps 0, 3, 6,
# 9; Celery's default is 0), so a run a person just decided resumes before the backlog of new
# runs starts. A route, not a task attribute, which Celery 5 warns about in every process.
CELERY_TASK_ROUTES = {"agents.tasks.run_start": {"priority": 6}}

# Engine tunables.
AGENTFAST_CONFIG = Path(env.str("AGENTFAST_CONFIG", default="").strip() or BASE_DIR / "agentfast.yaml")
AGENTFAST_TOOL_MODULES = _list("AGENTFAST_TOOL_MODULES", [])
AGENTFAST_LEASE_SECONDS = _float(
    "AGENTFAST_LEASE_SECONDS", 60, zero=False, minimum=_ENGINE_SECONDS_MIN, maximum=_ENGINE_SECONDS_MAX
)
# An external agent's claim with no result after this long is in doubt: it is never handed out again.
AGENTFAST_EXTERNAL_CLAIM_SECONDS = _float(
    "AGENTFAST_EXTERNAL_CLAIM_SECONDS", 300, zero=False, minimum=_ENGINE_SECONDS_MIN, maximum=_ENGINE_SECONDS_MAX
)
AGENTFAST_SWEEP_SECONDS = _float(
    "AGENTFAST_SWEEP_SECONDS", 5, zero=False, minimum=_TIMEOUT_SECONDS_MIN, maximum=_ENGINE_SECONDS_MAX
)
# How long a decided-but-not-resumed or queued-but-not-started run may wait for its
# Celery message before the sweeper assumes the message was lost.
AGENTFAST_SWEEP_GRACE_SECONDS = _float("AGENTFAST_SWEEP_GRACE_SECONDS", 10, zero=True, maximum=_ENGINE_SECONDS_MAX)

CELERY_BEAT_SCHEDULE = {
    "agentfast-sweep": {"task": "agents.tasks.sweep", "schedule": AGENTFAST_SWEEP_SECONDS},
}
# Beat's record of when each entry last ran lives with the rest of the state, not in the folder
# beat started in (Celery's default): a service's folder is often read-only, and beat stopped there.
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

# -- Notifications (webhooks, email, chat) ---------------------------------------------------
# Links in mails and chat messages point here.
AGENTFAST_BASE_URL = _http_url("AGENTFAST_BASE_URL", "http://localhost:8321")


def _email_url(name: str) -> dict[str, Any]:
    """Read the mail backend's URL; one django-environ cannot read stops the process, naming the variable, not the URL.

    The URL holds the mail server's password: only the problem is said.
    """
    try:
        return env.email_url(name)
    except (ValueError, ImproperlyConfigured) as exc:
        raise ImproperlyConfigured(f"{name}: {exc} (like smtp://user:password@mail.example.com:587)") from None


# EMAIL_URL (smtp://user:pass@host:587, consolemail://, …) chooses the mail backend; without
# it, and without the usual EMAIL_BACKEND, mail is written to files under var/mail/.
if env.str("EMAIL_URL", default=""):
    vars().update(_email_url("EMAIL_URL"))
elif env.str("EMAIL_BACKEND", default=""):
    EMAIL_BACKEND = env.str("EMAIL_BACKEND")
    EMAIL_HOST = env.str("EMAIL_HOST", default="localhost")
    EMAIL_PORT = _int("EMAIL_PORT", 25, minimum=1, maximum=65535)
    # The rest of Django's usual names: left unread, a server's login and TLS were dropped without a word.
    EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", default="").strip()
    EMAIL_HOST_PASSWORD = _secret("EMAIL_HOST_PASSWORD")
    EMAIL_USE_TLS = _bool("EMAIL_USE_TLS", False)
    EMAIL_USE_SSL = _bool("EMAIL_USE_SSL", False)
    if EMAIL_USE_TLS and EMAIL_USE_SSL:
        raise ImproperlyConfigured("EMAIL_USE_TLS and EMAIL_USE_SSL: turn one of them on, not both")
else:
    EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    EMAIL_FILE_PATH = str(VAR_DIR / "mail")
# Seconds a mail server may take to answer. Django's default is to wait for ever, and a worker
# sends on threads, where Celery's time limits do not apply: a silent server would keep a thread
# per attempt, and the sweeper starts another attempt every minute, until no thread is left.
EMAIL_TIMEOUT = _float("EMAIL_TIMEOUT", 10, zero=False, minimum=_TIMEOUT_SECONDS_MIN)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="agentfast <agentfast@localhost>")
# The signing secret of the Slack app whose buttons decide (Basic Information → Signing Secret).
AGENTFAST_SLACK_SIGNING_SECRET = _secret("SLACK_SIGNING_SECRET")
CELERY_BEAT_SCHEDULE["agentfast-deliveries"] = {
    "task": "agents.notify.tasks.deliveries_sweep",
    "schedule": AGENTFAST_SWEEP_SECONDS,
}
# Days a settled delivery (delivered, failed, superseded) is kept for the deliveries page; 0 keeps
# them for ever. The audit keeps every decision regardless; a pending delivery is never pruned.
AGENTFAST_DELIVERY_RETENTION_DAYS = _int("AGENTFAST_DELIVERY_RETENTION_DAYS", 90, minimum=0, maximum=36_500)
CELERY_BEAT_SCHEDULE["agentfast-housekeeping"] = {
    "task": "agents.notify.tasks.housekeeping",
    "schedule": 3600,
}
# -- end of notifications ----------------------------------------------------------------------

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    # The one handler, on the root logger: daphne and Celery add one of their own to the root
    # only when it has none, and a handler on `agents` as well wrote each of its lines twice.
    # The root's level is the processes' (dashboard.processes.log_level).
    "root": {"handlers": ["console"], "level": _log_level("AGENTFAST_LOG_LEVEL", "WARNING")},
    "loggers": {
        "agents": {"level": _log_level("AGENTFAST_LOG_LEVEL", "INFO")},
        # A refused or missing page (4xx) is the client's doing, not the server's: Django logged
        # each 403 with a full traceback. Server errors (5xx) are still logged, with theirs.
        "django.request": {"level": "ERROR"},
    },
}

# Model endpoints (`model: openai:<name>`): seconds per request, and the SDK's retries of 408,
# 409, 429, 5xx and dropped connections with backoff (about 7 s over 4 tries; its default 2
# failed about one run in 500 at a 10% error rate).
OPENAI_TIMEOUT = _float("OPENAI_TIMEOUT", 60, zero=False, minimum=_TIMEOUT_SECONDS_MIN, maximum=_ENGINE_SECONDS_MAX)
# At most 100 (each waits up to 8 s): a million held a run on a dead endpoint for months.
OPENAI_MAX_RETRIES = _int("OPENAI_MAX_RETRIES", 4, minimum=0, maximum=100)
# Seconds a whole streamed answer may take, however steadily it comes: OPENAI_TIMEOUT bounds
# each read only, and a worker's thread has no other limit (Celery's time limits need prefork).
OPENAI_TURN_TIMEOUT = _float(
    "OPENAI_TURN_TIMEOUT", 600, zero=False, minimum=_ENGINE_SECONDS_MIN, maximum=_ENGINE_SECONDS_MAX
)

# The endpoint of `model: openai:<name>` (agents.llm.openai reads it); checked here, as a typo
# (no scheme) failed every run with the SDK's "Connection error.".
if env.str("OPENAI_BASE_URL", default="").strip():
    _http_url("OPENAI_BASE_URL", "")

# A bearer token for Prometheus' scrape of /metrics (an admin's API token works too).
AGENTFAST_METRICS_TOKEN = _secret("AGENTFAST_METRICS_TOKEN")
# The demo model's pause per streamed token, so a run unfolds at a readable pace (`make run` sets it);
# at most 10 s: the lease keeper would hold a run whose every word takes days for ever.
AGENTFAST_DEMO_DELAY_MS = _float("AGENTFAST_DEMO_DELAY_MS", 0, zero=True, maximum=10_000)
