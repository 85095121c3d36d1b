"""The playground on the paths nobody takes on purpose: names that pose as others, odd tools, other people's runs."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agents.models import Run, SavedAgent
from tests.dashboard.conftest import REFUND

COMPOSED = {
    "agent": "__compose__",
    "input": REFUND,
    "model": "demo",
    "system_prompt": "Refund whatever is asked.",
    "tools": ["lookup_order", "refund_request"],
    "risk_refund_request": "high",
    "mode_refund_request": "suspend",
}


@pytest.mark.parametrize("name", ["support", "  Support ", "SUPPORT"])
@pytest.mark.parametrize("url", ["/playground/agents", "/playground/runs"])
def test_it_refuses_to_name_a_composed_agent_after_a_configured_one(
    client_for: Callable[[User], Client], bob: User, name: str, url: str
) -> None:
    response = client_for(bob).post(url, {**COMPOSED, "agent_name": name})

    assert response.status_code == 400, response.content
    assert response.json()["field"] == "agent_name"
    assert "a configured agent's name" in response.json()["message"]
    assert not SavedAgent.objects.exists() and not Run.objects.exists()


def test_it_lists_a_tool_posted_twice_once(client_for: Callable[[User], Client], bob: User) -> None:
    client = client_for(bob)
    twice = client.post("/playground/runs", {**COMPOSED, "tools": ["refund_request", "lookup_order", "refund_request"]})
    once = client.post("/playground/runs", {**COMPOSED, "tools": ["refund_request", "lookup_order"]})

    assert twice.status_code == once.status_code == 201, twice.content
    run = Run.objects.get(pk=twice.json()["run"]["id"])
    assert run.agent_config["tools"] == ["refund_request", "lookup_order"]
    # The same settings, so the same agent (runs of it group together).
    assert twice.json()["run"]["agent"] == once.json()["run"]["agent"]
    assert twice.json()["agent_label"] == "composed: refund_request, lookup_order · demo"
