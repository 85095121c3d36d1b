"""The health check a load balancer or `make run` asks: the process answers and reaches its database and Redis."""

from __future__ import annotations

import functools
import logging

import redis
from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, JsonResponse
from redis.backoff import NoBackoff
from redis.retry import Retry

logger = logging.getLogger(__name__)
# How long a probe waits for a pooled connection: a balancer gives up after a few seconds, and
# the pool's own wait (30 s, for requests riding out a blip) would outlast it.
PROBE_SECONDS = 2.0
# Redis is asked once, briefly: Celery's own connection check retries after 2 s, past a probe's timeout.
REDIS_PROBE_SECONDS = 0.5


# Said while Redis is out of reach: the process still takes decisions, so a balancer keeps it.
REDIS_DOWN = (
    "Redis is out of reach: decisions and new runs are stored, but live pages stand still and no run "
    "starts or resumes until it is back"
)


def healthz(request: HttpRequest) -> JsonResponse:
    """Answer 200 `{"ok": true, "redis": true}`, or 503 saying the database is out of reach.

    A probe asks every few seconds: a database that is down is its answer, not an error of
    the site (Django's 500 page, with a traceback logged at each probe). Redis out of reach
    is said (`"redis": false` and why) with a 200: the process still records every decision,
    and the sweeper sends what waits once Redis is back, so a balancer should keep it.
    """
    try:
        _ask_the_database()
    except DatabaseError as exc:
        logger.warning("health check: the database is out of reach: %s", exc)
        return JsonResponse({"ok": False, "error": "the database is out of reach"}, status=503)
    if not _redis_answers():
        return JsonResponse({"ok": True, "redis": False, "warning": REDIS_DOWN})
    return JsonResponse({"ok": True, "redis": True})


def _redis_answers() -> bool:
    try:
        return bool(_redis().ping())
    except (redis.RedisError, OSError) as exc:
        logger.warning("health check: Redis is out of reach: %s", exc)
        return False


@functools.cache
def _redis() -> redis.Redis:
    """Return a client of the site's Redis that tries once and waits REDIS_PROBE_SECONDS at most."""
    return redis.Redis.from_url(
        settings.REDIS_URL,
        socket_timeout=REDIS_PROBE_SECONDS,
        socket_connect_timeout=REDIS_PROBE_SECONDS,
        retry=Retry(NoBackoff(), 0),
    )


def _ask_the_database() -> None:
    pool = getattr(connection, "pool", None)  # PostgreSQL's connection pool, when there is one
    if pool is None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return
    import psycopg

    try:
        pool.open()  # as Django's first connection does; a no-op once open
        with pool.connection(timeout=PROBE_SECONDS) as pooled:
            pooled.execute("SELECT 1")
    except psycopg.Error as exc:  # the pool's timeout is one too
        raise DatabaseError(str(exc)) from exc
