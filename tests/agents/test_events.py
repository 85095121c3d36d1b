"""agents.events.publish: a RunEvent row now, a Channels push only after commit."""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import transaction

from agents import events, services
from agents.models import RunEvent

pytestmark = pytest.mark.django_db(transaction=True)


async def listen(group: str) -> str:
    """Join a group the way a consumer does; return the channel to receive on."""
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    return channel


async def receive(channel: str, timeout: float = 2.0) -> dict:
    return await asyncio.wait_for(get_channel_layer().receive(channel), timeout)


@database_sync_to_async
def new_run() -> str:
    return services.run_create(agent="support", input="hi", enqueue=False).id


async def test_it_pushes_a_committed_event_to_the_run_and_approvals_groups():
    run_id = await new_run()
    run_channel, inbox_channel = await listen(events.run_group(run_id)), await listen(events.APPROVALS_GROUP)

    seq = await database_sync_to_async(events.publish)(
        run_id=run_id, type="approval_required", data={"approval_id": "appr_x"}
    )

    for channel in (run_channel, inbox_channel):
        message = await receive(channel)
        assert message["type"] == "run.event"
        assert (message["run_id"], message["seq"], message["event"]) == (run_id, seq, "approval_required")
        assert message["data"] == {"approval_id": "appr_x"}
    assert await RunEvent.objects.filter(run_id=run_id, seq=seq, type="approval_required").aexists()


async def test_it_pushes_nothing_for_a_rolled_back_event():
    run_id = await new_run()
    channel = await listen(events.run_group(run_id))

    @database_sync_to_async
    def publish_twice() -> None:
        with pytest.raises(RuntimeError), transaction.atomic():
            events.publish(run_id=run_id, type="message", data={"content": "never"})
            raise RuntimeError("roll back")
        events.publish(run_id=run_id, type="message", data={"content": "kept"})

    await publish_twice()

    assert (await receive(channel))["data"] == {"content": "kept"}  # the first push never happened
    rows = [(e.seq, e.data) async for e in RunEvent.objects.filter(run_id=run_id)]
    assert rows == [(1, {"content": "kept"})]


async def test_it_sends_live_deltas_without_storing_them():
    run_id = await new_run()
    channel = await listen(events.run_group(run_id))

    seq = await database_sync_to_async(events.publish)(run_id=run_id, type="delta", data={"text": "Hel"}, persist=False)

    assert seq is None
    assert (await receive(channel))["data"] == {"text": "Hel"}
    assert not await RunEvent.objects.filter(run_id=run_id).aexists()


async def test_it_repairs_a_lone_surrogate_in_an_event_instead_of_losing_it():
    run_id = await new_run()
    channel = await listen(events.run_group(run_id))

    seq = await database_sync_to_async(events.publish)(run_id=run_id, type="message", data={"content": "a\ud800b"})

    assert (await receive(channel))["data"] == {"content": "a\ufffdb"}
    assert (await RunEvent.objects.aget(run_id=run_id, seq=seq)).data == {"content": "a\ufffdb"}
