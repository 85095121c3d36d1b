"""The MCP gateway's wait for a decision: woken by the decision's event, not by its next poll.

Real Redis, the real channel layer and a decision taken through the services in this process
(its event published on commit, as the web process or the CLI publishes it).
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from agents import events, services
from agents.gateway import services as gateway
from agents.gateway.mcp import _Wakeup
from tests.support.flows import decide


@pytest.fixture
def pending_call(transactional_db: None, alice: Any) -> gateway.GateAnswer:
    services.user_create(username="robot", role="agent")
    request = gateway.GateRequest(
        agent="billing",
        session="s1",
        call_id="c1",
        tool="refund_request",
        arguments={"order_id": "A1001", "amount_cents": 2500},
    )
    answer = gateway.gate_call(owner="robot", request=request)
    assert answer.decision == "pending"
    return answer


async def test_a_decision_wakes_the_wait_long_before_its_poll_is_due(pending_call: gateway.GateAnswer) -> None:
    async with _Wakeup(events.run_group(pending_call.run_id)) as wakeup:
        assert wakeup.layer is not None

        async def approve_soon() -> None:
            await anyio.sleep(0.2)
            await sync_to_async(decide)(pending_call.approval_id, "approved", by="alice")
            await sync_to_async(connections.close_all)()

        started = time.monotonic()
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(approve_soon)
            await wakeup.wait(60)  # a poll due in a minute
        woken_after = time.monotonic() - started

    assert woken_after < 30  # woken by the decision's event; a poll would have taken the whole minute


async def test_it_waits_out_each_poll_when_the_channel_layer_cannot_be_reached(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [{"address": "redis://127.0.0.1:1"}]},  # nothing listens there
        }
    }
    async with _Wakeup(events.run_group("ext_nobody")) as wakeup:
        assert wakeup.layer is None
        started = time.monotonic()
        await wakeup.wait(0.3)
        assert time.monotonic() - started >= 0.29
