"""The health check a load balancer or `make run` asks: the process answers and reaches its database."""

from __future__ import annotations

import logging

from django.db import DatabaseError, connection
from django.http import HttpRequest, JsonResponse

logger = logging.getLogger(__name__)


def healthz(request: HttpRequest) -> JsonResponse:
    """Answer 200 `{"ok": true}`, or 503 saying the database is out of reach.

    A probe asks every few seconds: a database that is down is its answer, not an error of
    the site (Django's 500 page, with a traceback logged at each probe).
    """
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError as exc:
        logger.warning("health check: the database is out of reach: %s", exc)
        return JsonResponse({"ok": False, "error": "the database is out of reach"}, status=503)
    return JsonResponse({"ok": True})
