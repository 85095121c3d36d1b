"""The Python client when a call ran but its report is lost: the caller still gets what the function did."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from agentfast_client import AsyncGate, Gate

from agents.models import ToolCall
from tests.clients.conftest import Server
from tests.clients.test_python_client_outages import Front

pytestmark = pytest.mark.integration
LOST = [(503, "0.2")] * 100  # every report refused as busy for longer than the client retries it


@pytest.fixture
def front(server: Server) -> Iterator[Front]:
    proxy = Front(server.url)
    proxy.refuse = {"/result": list(LOST)}
    yield proxy
    proxy.stop()


def _lost_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]


def _unreported(name: str) -> ToolCall:
    call = ToolCall.objects.get(name=name)
    assert call.executed_at is not None and call.result is None  # claimed, no result: the sweeper marks it in doubt
    return call


def _async_run(front: Front, server: Server, session: str, fn: Callable[..., Any]) -> Awaitable[Any]:
    async def flow() -> Any:
        gate = AsyncGate(front.url, server.agent_token, agent="billing", session=session, retry_for=1)
        try:
            return await gate.run(await gate.require("pay_invoice", {"cents": 700}, call_id="w7"), fn)
        finally:
            await gate.aclose()

    return flow()


def test_it_returns_the_value_of_a_call_whose_report_was_lost(
    server: Server, front: Front, caplog: pytest.LogCaptureFixture
) -> None:
    gate = Gate(front.url, server.agent_token, agent="billing", session="lost-1", retry_for=1)
    wires: list[int] = []

    @gate.guard(tool="pay_invoice")
    def pay_invoice(cents: int) -> str:
        wires.append(cents)
        return "W-1"

    with caplog.at_level(logging.WARNING, logger="agentfast_client"):
        assert pay_invoice(700, call_id="w7") == "W-1"

    assert wires == [700]
    call = _unreported("pay_invoice")
    [warning] = _lost_warnings(caplog)
    approval_id = server.approval_id(agent="billing", session="lost-1", call_id="w7")
    assert approval_id in warning and "in doubt" in warning and "503" in warning
    assert call.status == ToolCall.Status.RUNNING


def test_it_returns_the_value_of_an_async_call_whose_report_was_lost(
    server: Server, front: Front, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[int] = []

    async def wire(cents: int) -> str:
        ran.append(cents)
        return "W-2"

    with caplog.at_level(logging.WARNING, logger="agentfast_client"):
        assert asyncio.run(_async_run(front, server, "lost-2", wire)) == "W-2"

    assert ran == [700]
    _unreported("pay_invoice")
    [warning] = _lost_warnings(caplog)
    assert server.approval_id(agent="billing", session="lost-2", call_id="w7") in warning


def test_it_raises_the_functions_own_error_when_its_failure_was_not_reported(
    server: Server, front: Front, caplog: pytest.LogCaptureFixture
) -> None:
    gate = Gate(front.url, server.agent_token, agent="billing", session="lost-3", retry_for=1)

    def bounce(cents: int) -> str:
        raise ValueError(f"the bank bounced {cents}")

    async def bounce_async(cents: int) -> str:
        raise ValueError(f"the bank bounced {cents} again")

    with caplog.at_level(logging.WARNING, logger="agentfast_client"):
        with pytest.raises(ValueError, match="the bank bounced 700$"):
            gate.run(gate.require("pay_invoice", {"cents": 700}, call_id="w7"), bounce)
        with pytest.raises(ValueError, match="the bank bounced 700 again"):
            asyncio.run(_async_run(front, server, "lost-4", bounce_async))

    assert [call.result for call in ToolCall.objects.filter(name="pay_invoice")] == [None, None]
    assert len(_lost_warnings(caplog)) == 2
