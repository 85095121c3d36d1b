"""An agent's arguments that hold bidirectional controls: the reviewer sees what is stored, not a reordered line."""

from __future__ import annotations

from typing import Any

import pytest

from agents import services
from agents.gateway import services as gateway

POLICY = """
agents:
  support: {tools: [lookup_order]}
tool_overrides:
  wire_money: {risk: high}
"""
# A browser shows the part after the right-to-left override reversed: "DE99-0000DE12-3456", not what is stored.
SPOOF = "DE99-0000\u202e6543-21ED"


@pytest.fixture
def approval_id(db: None, agent_config: Any) -> str:
    agent_config(POLICY)
    services.user_create(username="robot", role="agent")
    request = gateway.GateRequest(
        agent="billing", session="s1", call_id="c1", tool="wire_money", arguments={"account": SPOOF, "cents": 2000}
    )
    return gateway.gate_call(owner="robot", request=request).approval_id


@pytest.mark.parametrize("path", ["/", "/approvals/{id}"])
def test_it_shows_a_bidirectional_override_in_arguments_as_an_escape(client_for, alice, approval_id, path):
    response = client_for(alice).get(path.format(id=approval_id), {"show": "all"})

    page = response.content.decode()
    assert response.status_code == 200
    assert "\u202e" not in page
    assert "DE99-0000\\u202e6543-21ED" in page
