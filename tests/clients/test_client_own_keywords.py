"""A guarded function with a parameter of its own named `session` (or `call_id`)."""

from __future__ import annotations

import pytest
from agentfast_client import Gate

from agents.models import ToolCall
from tests.clients.conftest import Server

pytestmark = pytest.mark.integration


def test_a_functions_own_session_parameter_reaches_it(server: Server) -> None:
    gate = Gate(server.url, server.agent_token, agent="billing", session="thread-7")
    closed: list[str] = []

    @gate.guard(tool="close_session")
    def close_session(user: str, session: str = "current") -> str:
        """Log a user's session out."""
        closed.append(session)
        return f"closed {session} of {user}"

    # The caller means the function's own `session`; the guard takes it as agentfast's session.
    assert close_session("bob", session="s-123", call_id="k1") == "closed s-123 of bob"
    assert closed == ["s-123"]
    assert ToolCall.objects.get(name="close_session").arguments == {"user": "bob", "session": "s-123"}
