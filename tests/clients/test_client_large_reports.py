"""The Python client's report of a call whose value (or error) is larger than one request body may be.

The server refuses any body over AGENTFAST_MAX_BODY_BYTES (320 KiB by default) with a 413
before reading it; the client sends the whole value, so a call that ran is never recorded:
it stays claimed, the sweeper marks it in doubt, a person is asked to check a call that
succeeded, and the same call again raises AlreadyClaimed instead of returning its result.
"""

from __future__ import annotations

import pytest
from agentfast_client import AlreadyClaimed, Gate

from agents.models import ToolCall
from tests.clients.conftest import Server

pytestmark = pytest.mark.integration


def test_a_successful_call_with_a_large_result_is_recorded_as_succeeded(server: Server) -> None:
    gate = Gate(server.url, server.agent_token, agent="billing", session="big-1", retry_for=2)
    ran: list[int] = []

    @gate.guard(tool="export_report")  # unlisted: allowed at once
    def export_report(rows: int) -> list[str]:
        ran.append(rows)
        return [f"row {i:06d} " + "x" * 90 for i in range(rows)]  # ~400 KB: an ordinary export

    assert len(export_report(4000, call_id="e1")) == 4000
    call = ToolCall.objects.get(name="export_report")
    assert call.result is not None, "the report was refused (413): a call that succeeded is left to be marked in doubt"
    assert call.result["ok"] is True
    try:
        export_report(4000, call_id="e1")  # the same call again: the stored outcome, not AlreadyClaimed
    except AlreadyClaimed as exc:
        pytest.fail(f"the same call again: {exc}")
    assert ran == [4000]


def test_a_failed_call_with_a_long_error_is_recorded_as_failed(server: Server) -> None:
    gate = Gate(server.url, server.agent_token, agent="billing", session="big-2", retry_for=2)

    @gate.guard(tool="fetch_page")
    def fetch_page(url: str) -> str:
        raise RuntimeError("upstream said: " + "<html>" * 70_000)  # an error page quoted in the message

    with pytest.raises(RuntimeError):
        fetch_page("https://example.test", call_id="f1")
    call = ToolCall.objects.get(name="fetch_page")
    # The server keeps 10,000 characters of an error; the client sent 420,000 and was refused.
    assert call.result is not None, "the failure was never recorded (413): the call is left to be marked in doubt"
    assert call.result["ok"] is False
