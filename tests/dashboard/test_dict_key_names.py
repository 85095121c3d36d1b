"""Names people and agents choose (an argument, a reviewer, a tool) that are also a dict's methods.

A Django template reads `mapping.items` as the key "items" before the method, so a page that
loops over a mapping named by stored data shows that key's value, or fails, instead of the rows.
"""

from __future__ import annotations

from typing import Any

import pytest

from agents import services
from agents.gateway import services as gateway
from agents.tools.registry import Tool, _arguments_model, registry
from tests.support.flows import decide

POLICY = """
agents:
  support: {tools: [lookup_order]}
tool_overrides:
  items: {risk: high}
"""


@pytest.fixture
def robot(db: None, agent_config: Any) -> str:
    agent_config(POLICY)
    user, _ = services.user_create(username="robot", role="agent")
    return user.username


def _gate(owner: str, call_id: str, **arguments: Any) -> str:
    request = gateway.GateRequest(agent="keys", session="s1", call_id=call_id, tool="items", arguments=arguments)
    return gateway.gate_call(owner=owner, request=request).approval_id


def _items_tool(ctx: Any, items: list[str], values: str) -> dict[str, Any]:
    return {"ok": True}


def test_it_shows_an_edit_of_an_argument_named_items_on_the_audit_page(client_for, carol, robot, monkeypatch):
    approval_id = _gate(robot, "c1", items=["A1001"], values="x")
    # A tool of this process with such arguments, so that a reviewer may edit them (edits meet its schema).
    tool = Tool(name="items", description="Ship items.", func=_items_tool, args_model=_arguments_model(_items_tool))
    monkeypatch.setitem(registry.tools, "items", tool)
    decide(approval_id, "approved", by="carol", arguments={"items": ["A1001", "A1002"], "values": "y"})

    response = client_for(carol).get("/audit")

    html = response.content.decode()
    assert response.status_code == 200
    assert "<tr><td><code>items</code></td><td><del>[&quot;A1001&quot;]</del></td>" in html
    assert (
        "<tr><td><code>values</code></td><td><del>&quot;x&quot;</del></td><td><ins>&quot;y&quot;</ins></td></tr>"
        in html
    )


def test_it_shows_insights_of_a_reviewer_an_agent_and_a_tool_named_like_dict_methods(client_for, robot):
    items, _ = services.user_create(username="items", role="reviewer")
    decide(_gate(robot, "c1", order="A1001"), "approved", by="items")

    response = client_for(items).get("/insights")

    html = response.content.decode()
    assert response.status_code == 200
    assert '<tr data-name="items"><td>items</td><td class="approved">1</td>' in html  # the tool and the reviewer
    assert '<tr data-name="keys"><td>keys</td><td class="approved">1</td>' in html  # the agent
    assert '<tr data-reviewer="items"><td>items</td><td class="stamp-count">1</td></tr>' in html
