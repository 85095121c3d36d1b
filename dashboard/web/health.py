"""The health check a load balancer or `make run` asks: the process answers and reaches its database (and Redis?)."""

from __future__ import annotations

import logging

from django.db import DatabaseError, connection
from django.http import HttpRequest, JsonResponse

from agents import queue

logger = logging.getLogger(__name__)
# How long a probe waits for a pooled connection: a balancer gives up after a few seconds, and
# the pool's own wait (30 s, for requests riding out a blip) would outlast it.
PROBE_SECONDS = 2.0


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
    reachable, where = queue.broker_reachable(timeout=PROBE_SECONDS)
    if not reachable:
        logger.warning("health check: Redis is out of reach: %s", where)
        return JsonResponse({"ok": True, "redis": False, "warning": REDIS_DOWN})
    return JsonResponse({"ok": True, "redis": True})


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
