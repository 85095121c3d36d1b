"""The health check a load balancer or `make run` asks: the process answers and reaches its database."""

from __future__ import annotations

import logging

from django.db import DatabaseError, connection
from django.http import HttpRequest, JsonResponse

logger = logging.getLogger(__name__)
# How long a probe waits for a pooled connection: a balancer gives up after a few seconds, and
# the pool's own wait (30 s, for requests riding out a blip) would outlast it.
PROBE_SECONDS = 2.0


def healthz(request: HttpRequest) -> JsonResponse:
    """Answer 200 `{"ok": true}`, or 503 saying the database is out of reach.

    A probe asks every few seconds: a database that is down is its answer, not an error of
    the site (Django's 500 page, with a traceback logged at each probe).
    """
    try:
        _ask_the_database()
    except DatabaseError as exc:
        logger.warning("health check: the database is out of reach: %s", exc)
        return JsonResponse({"ok": False, "error": "the database is out of reach"}, status=503)
    return JsonResponse({"ok": True})


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
