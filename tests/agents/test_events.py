"""agents.events.publish: a RunEvent row now, a Channels push only after commit."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from agents import events, services
from agents.models import RunEvent


def listen(group: str) -> str:
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(group, channel)
    return channel


def receive(channel: str, timeout: float = 2.0) -> dict:
    async def get() -> dict:
        return await asyncio.wait_for(get_channel_layer().receive(channel), timeout)

    return async_to_sync(get)()


def test_it_pushes_a_committed_event_to_the_run_and_approvals_groups(db, django_capture_on_commit_callbacks):
    run = services.run_create(agent="support", input="hi", enqueue=False)
    run_channel, inbox_channel = listen(events.run_group(run.id)), listen(events.APPROVALS_GROUP)

    with django_capture_on_commit_callbacks(execute=True):
        seq = events.publish(run_id=run.id, type="approval_required", data={"approval_id": "appr_x"})
    events.flush()

    for channel in (run_channel, inbox_channel):
        message = receive(channel)
        assert message["type"] == "run.event"
        assert (message["run_id"], message["seq"], message["event"]) == (run.id, seq, "approval_required")
        assert message["data"] == {"approval_id": "appr_x"}
    assert RunEvent.objects.get(run=run, seq=seq).type == "approval_required"


def test_it_pushes_nothing_for_a_rolled_back_event(transactional_db):
    run = services.run_create(agent="support", input="hi", enqueue=False)
    channel = listen(events.run_group(run.id))

    with pytest.raises(RuntimeError), transaction.atomic():
        events.publish(run_id=run.id, type="message", data={"content": "never"})
        raise RuntimeError("roll back")
    events.publish(run_id=run.id, type="message", data={"content": "kept"})
    events.flush()

    assert receive(channel)["data"] == {"content": "kept"}  # the first push never happened
    assert list(RunEvent.objects.filter(run=run).values_list("seq", "data")) == [(1, {"content": "kept"})]


def test_it_sends_live_deltas_without_storing_them(db):
    run = services.run_create(agent="support", input="hi", enqueue=False)
    channel = listen(events.run_group(run.id))

    assert events.publish(run_id=run.id, type="delta", data={"text": "Hel"}, persist=False) is None
    events.flush()

    assert receive(channel)["data"] == {"text": "Hel"}
    assert not RunEvent.objects.filter(run=run).exists()
