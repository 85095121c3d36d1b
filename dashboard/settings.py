"""Django settings for agentfast, read from the environment.

Defaults give a working single machine with nothing installed: SQLite in `var/` and the
embedded Redis. Production sets DATABASE_URL and REDIS_URL.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from agents import embedded_redis

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("AGENTFAST_VAR_DIR", BASE_DIR / "var")).resolve()


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() in {"1", "true", "yes", "on"}


def _database(url: str | None) -> dict[str, object]:
    """Translate DATABASE_URL (postgres://… or sqlite:///path) into a Django DATABASES entry."""
    if not url:
        return _sqlite(VAR_DIR / "agentfast.sqlite3")
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        return _sqlite(Path(unquote(parts.path)))
    if parts.scheme in {"postgres", "postgresql"}:
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parts.path.lstrip("/")) or "postgres",
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
            "OPTIONS": dict(parse_qsl(parts.query)),
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
        }
    raise ValueError(f"DATABASE_URL: unsupported scheme {parts.scheme!r} (use postgres:// or sqlite://)")


def _sqlite(path: Path) -> dict[str, object]:
    path.parent.mkdir(parents=True, exist_ok=True)
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


def _redis_url() -> str:
    explicit = os.environ.get("REDIS_URL")
    if explicit:
        return explicit
    return embedded_redis.url(embedded_redis.socket_path(VAR_DIR))


def _celery_url(redis_url: str) -> str:
    # redis-py spells a unix socket unix://, kombu spells it redis+socket://.
    if redis_url.startswith("unix://"):
        return "redis+socket://" + redis_url.removeprefix("unix://")
    return redis_url


SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "dev-only-insecure-key-change-me")
DEBUG = _env_bool("DJANGO_DEBUG", True)
ALLOWED_HOSTS = [h for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",") if h]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "ninja",  # serves /api/docs' Swagger UI from its own static files, not a CDN
    "agents",
    "dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
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

DATABASES = {"default": _database(os.environ.get("DATABASE_URL"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
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
# Serve static files straight from the app folders: `make run` needs no collectstatic.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# Bodies larger than this are refused before any JSON parsing (the API, forms).
DATA_UPLOAD_MAX_MEMORY_SIZE = 256 * 1024
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o]

REDIS_URL = _redis_url()
REDIS_IS_EMBEDDED = "REDIS_URL" not in os.environ

# Redis pub/sub: a group send is one PUBLISH. Nothing is queued for a viewer who is away;
# viewers catch up from RunEvent rows (SSE replay, the inbox's re-sync).
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": os.environ.get("AGENTFAST_CHANNEL_LAYER", "channels_redis.pubsub.RedisPubSubChannelLayer"),
        "CONFIG": {"hosts": [{"address": REDIS_URL}]},
    }
}
# -- live connections (h4): extra channel-layer Redis hosts, body and stream limits ------
# Several hosts shard the groups (comma-separated Redis URLs; REDIS_URL stays the first).
AGENTFAST_CHANNEL_HOSTS = [u for u in os.environ.get("AGENTFAST_CHANNEL_HOSTS", "").split(",") if u]
CHANNEL_LAYERS["default"]["CONFIG"]["hosts"] += [{"address": u} for u in AGENTFAST_CHANNEL_HOSTS]
# A request body over this is refused (413) before it is read; forms get the headroom.
AGENTFAST_MAX_BODY_BYTES = int(os.environ.get("AGENTFAST_MAX_BODY_BYTES", DATA_UPLOAD_MAX_MEMORY_SIZE + 64 * 1024))
# Open SSE streams per user and process; one more is refused (429).
AGENTFAST_STREAMS_PER_USER = int(os.environ.get("AGENTFAST_STREAMS_PER_USER", "20"))
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
# A publish must fail fast when Redis is down: the decision is already committed and the
# sweeper will enqueue it later (Redis is never the source of truth).
CELERY_TASK_PUBLISH_RETRY = False
CELERY_BROKER_TRANSPORT_OPTIONS = {"socket_connect_timeout": 2, "socket_timeout": 5, "visibility_timeout": 3600}
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# Engine tunables.
AGENTFAST_CONFIG = Path(os.environ.get("AGENTFAST_CONFIG", BASE_DIR / "agentfast.yaml"))
AGENTFAST_TOOL_MODULES = [m for m in os.environ.get("AGENTFAST_TOOL_MODULES", "").split(",") if m]
AGENTFAST_LEASE_SECONDS = float(os.environ.get("AGENTFAST_LEASE_SECONDS", "60"))
AGENTFAST_SWEEP_SECONDS = float(os.environ.get("AGENTFAST_SWEEP_SECONDS", "5"))
# How long a decided-but-not-resumed or queued-but-not-started run may wait for its
# Celery message before the sweeper assumes the message was lost.
AGENTFAST_SWEEP_GRACE_SECONDS = float(os.environ.get("AGENTFAST_SWEEP_GRACE_SECONDS", "10"))

CELERY_BEAT_SCHEDULE = {
    "agentfast-sweep": {"task": "agents.tasks.sweep", "schedule": AGENTFAST_SWEEP_SECONDS},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"agents": {"handlers": ["console"], "level": os.environ.get("AGENTFAST_LOG_LEVEL", "INFO")}},
}
