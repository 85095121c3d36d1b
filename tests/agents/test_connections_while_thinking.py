"""A driving thread holds no database connection while the model thinks (issue 12: runs in flight).

A worker drives dozens of runs on threads; with a pool (Postgres), each hands its connection
back before the model call, so the pool and the server's max_connections need not grow with
the threads. Without a pool (SQLite) the thread keeps its connection: reopening costs more.
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from agents.models import Run
from agents.runtime.driver import _release_connection


def _pooled() -> bool:
    return getattr(connection, "pool", None) is not None


@pytest.mark.django_db(transaction=True)
def test_it_gives_the_connection_back_between_steps_when_pooled():
    assert Run.objects.count() == 0  # opens this thread's connection

    _release_connection()

    assert (connection.connection is None) is _pooled()
    assert Run.objects.count() == 0  # the next query simply takes one again
    assert connection.connection is not None


@pytest.mark.django_db(transaction=True)
def test_it_keeps_the_connection_inside_a_transaction():
    with transaction.atomic():
        Run.objects.exists()
        _release_connection()
        assert connection.connection is not None  # an open transaction is never cut
