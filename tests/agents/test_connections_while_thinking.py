"""A driving thread holds no database connection while the model thinks or a tool runs (issue 12).

A worker drives dozens of runs on threads; with a pool (Postgres), each hands its connection
back before the model call and before a tool's own work, so the pool and the server's
max_connections need not grow with the threads. Without a pool (SQLite) the thread keeps its
connection: reopening costs more.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from django.db import connection, transaction

from agents import runtime, services
from agents.models import Run, SideEffect
from agents.runtime.execution import release_connection
from agents.tools import registry
from tests.support.flows import decide, pending


def _pooled() -> bool:
    return getattr(connection, "pool", None) is not None


@pytest.mark.django_db(transaction=True)
def test_it_gives_the_connection_back_between_steps_when_pooled():
    assert Run.objects.count() == 0  # opens this thread's connection

    release_connection()

    assert (connection.connection is None) is _pooled()
    assert Run.objects.count() == 0  # the next query simply takes one again
    assert connection.connection is not None


@pytest.mark.django_db(transaction=True)
def test_it_keeps_the_connection_inside_a_transaction():
    with transaction.atomic():
        Run.objects.exists()
        release_connection()
        assert connection.connection is not None  # an open transaction is never cut


@pytest.mark.django_db(transaction=True)
def test_a_running_tool_holds_no_connection_when_pooled(monkeypatch):
    held: list[bool] = []

    def spying(name: str) -> None:
        tool = registry.get(name)
        assert tool is not None

        def func(ctx: Any, **arguments: Any) -> Any:
            held.append(connection.connection is not None)
            return tool.func(ctx, **arguments)  # the demo tool writes its side effect: it takes one again

        monkeypatch.setitem(registry.tools, name, replace(tool, func=func))

    spying("lookup_order")
    spying("refund_request")
    run = services.run_create(agent="support", input="Refund order A1001 for 25.00 USD", enqueue=False)
    runtime.drive(run.id, stream=False)
    [approval] = pending(run)
    decide(approval, "approved", auto_resume=False)
    runtime.drive(run.id, stream=False)

    assert held == [not _pooled(), not _pooled()]  # lookup_order, then the approved refund
    assert Run.objects.get(pk=run.id).status == Run.Status.COMPLETED
    assert SideEffect.objects.filter(tool="refund_request").count() == 1
