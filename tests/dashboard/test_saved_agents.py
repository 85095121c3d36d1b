"""Saved agents: a composed agent kept under a name by its owner, picked again in the playground."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.auth.models import User
from django.test import Client

from agents.models import Run, SavedAgent

COMPOSED = {
    "agent": "__compose__",
    "model": "demo",
    "system_prompt": "Be brief.",
    "tools": ["lookup_order", "send_email"],
    "risk_send_email": "high",
    "mode_send_email": "defer",
}


def save(client: Client, name: str) -> dict:
    response = client.post("/playground/agents", {**COMPOSED, "agent_name": name})
    assert response.status_code == 201, response.content
    return response.json()["agent"]


def test_it_saves_a_composed_agent_and_offers_it_to_its_owner_only(
    client_for: Callable[[User], Client], alice: User, bob: User
) -> None:
    saved = save(client_for(alice), "  email,   careful ")

    assert saved["name"] == "email, careful" and saved["tools"] == "lookup_order, send_email"
    assert f'<option value="{saved["value"]}" data-saved' in client_for(alice).get("/playground/").content.decode()
    assert saved["value"] not in client_for(bob).get("/playground/").content.decode()


def test_it_replaces_a_saved_agent_saved_again_under_its_name(
    client_for: Callable[[User], Client], alice: User
) -> None:
    client = client_for(alice)
    save(client, "mine")
    client.post("/playground/agents", {**COMPOSED, "agent_name": "mine", "system_prompt": "Be thorough."})

    [saved] = SavedAgent.objects.all()
    assert saved.definition["system_prompt"] == "Be thorough."


def test_it_refuses_to_save_without_a_name(client_for: Callable[[User], Client], alice: User) -> None:
    response = client_for(alice).post("/playground/agents", {**COMPOSED, "agent_name": "   "})

    assert response.status_code == 400 and response.json()["field"] == "name"
    assert not SavedAgent.objects.exists()


def test_it_runs_a_picked_saved_agent_under_its_name(client_for: Callable[[User], Client], alice: User) -> None:
    client = client_for(alice)
    saved = save(client, "email, careful")

    response = client.post("/playground/runs", {"agent": saved["value"], "input": "hello"})

    assert response.status_code == 201, response.content
    run = Run.objects.get(pk=response.json()["run"]["id"])
    assert run.agent_config["tools"] == ["lookup_order", "send_email"]
    assert run.agent_config["tool_overrides"] == {"send_email": {"risk": "high", "hitl_mode": "defer"}}
    assert "<td>email, careful</td>" in client.get("/runs").content.decode()


def test_it_refuses_to_run_another_persons_saved_agent(
    client_for: Callable[[User], Client], alice: User, bob: User
) -> None:
    saved = save(client_for(alice), "alice's")

    response = client_for(bob).post("/playground/runs", {"agent": saved["value"], "input": "hello"})

    assert response.status_code == 400 and response.json()["field"] == "agent"
    assert not Run.objects.exists()


def test_it_refuses_a_name_with_an_invisible_or_direction_character(
    client_for: Callable[[User], Client], alice: User
) -> None:
    # "support\u202e" would read as another name in the runs list.
    for name in ("mine\u202e", "mi\u200bne"):
        response = client_for(alice).post("/playground/agents", {**COMPOSED, "agent_name": name})
        assert response.status_code == 400 and response.json()["field"] in ("name", "agent_name"), response.content
    assert not SavedAgent.objects.exists()
