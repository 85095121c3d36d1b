"""The playground's page and the endpoint that starts its runs (the streaming is the API's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agents import services
from agents.models import Run, SideEffect
from agents.policy import get_policy
from tests.dashboard.conftest import REFUND, XSS
from tests.support import flows
from tests.support.fake_openai import MODEL, FakeOpenAI, Reply, tool_messages


def test_it_offers_the_configured_agents_and_the_demo_prompts(
    client_for: Callable[[User], Client], alice: User
) -> None:
    response = client_for(alice).get("/playground/")
    assert response.status_code == 200
    page = response.content.decode()
    assert '<option value="support"' in page
    assert "Refund order A1001 for 25.00 USD" in page
    assert "js/playground.js" in page


def test_it_starts_a_queued_run_that_the_page_drives(
    client_for: Callable[[User], Client], alice: User, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks() as callbacks:
        response = client_for(alice).post("/playground/runs", {"agent": "support", "input": REFUND})
    assert response.status_code == 201
    run = Run.objects.get(pk=response.json()["run"]["id"])
    assert (run.status, run.auto_resume, run.created_by, run.started_from) == (
        Run.Status.QUEUED,
        False,
        "alice",
        "playground",
    )
    assert callbacks == []  # no worker is asked: the page drives it


@pytest.mark.parametrize(
    ("data", "field"), [({"agent": "nobody", "input": "hi"}, "agent"), ({"agent": "support", "input": ""}, "input")]
)
def test_it_refuses_a_bad_run_naming_the_field(
    client_for: Callable[[User], Client], alice: User, data: dict[str, str], field: str
) -> None:
    response = client_for(alice).post("/playground/runs", data)
    assert response.status_code == 400
    assert (response.json()["error_code"], response.json()["field"]) == ("invalid", field)
    assert not Run.objects.exists()


def test_it_lists_only_your_own_playground_runs(client_for: Callable[[User], Client], alice: User, bob: User) -> None:
    client_for(alice).post("/playground/runs", {"agent": "support", "input": "alice's playground prompt"})
    client_for(bob).post("/playground/runs", {"agent": "support", "input": "bob's playground prompt"})
    services.run_create(agent="support", input="alice's API prompt", created_by="alice", enqueue=False)
    page = client_for(alice).get("/playground/").content.decode()
    assert "alice&#x27;s playground prompt" in page
    assert "bob&#x27;s playground prompt" not in page
    assert "alice&#x27;s API prompt" not in page


def test_it_escapes_prompts_in_the_history(client_for: Callable[[User], Client], alice: User) -> None:
    client_for(alice).post("/playground/runs", {"agent": "support", "input": XSS})
    page = client_for(alice).get("/playground/").content.decode()
    assert "<img src=x" not in page
    assert "&lt;img src=x" in page


def test_it_enforces_csrf_when_starting_a_run(alice: User) -> None:
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    response = browser.post("/playground/runs", {"agent": "support", "input": "hi"})
    assert response.status_code == 403
    assert not Run.objects.exists()


def test_it_is_for_reviewers_and_admins_only(
    client: Client, client_for: Callable[[User], Client], dave: User, carol: User
) -> None:
    assert client.get("/playground/").status_code == 302  # to the login page
    assert client_for(dave).get("/playground/").status_code == 403
    assert client_for(dave).post("/playground/runs", {"agent": "support", "input": "hi"}).status_code == 403
    assert client_for(carol).get("/playground/").status_code == 200


# -- composed agents ---------------------------------------------------------------------


def composed(**fields: Any) -> dict[str, Any]:
    data = {
        "agent": "__compose__",
        "input": REFUND,
        "system_prompt": "You are terse.",
        "model": "demo",
        "tools": ["lookup_order", "refund_request"],
        "risk_lookup_order": "low",
        "mode_lookup_order": "suspend",
        "risk_refund_request": "high",
        "mode_refund_request": "suspend",
    }
    return {**data, **fields}


def _start(client: Client, data: dict[str, Any]) -> Run:
    response = client.post("/playground/runs", data)
    assert response.status_code == 201, response.json()
    return Run.objects.get(pk=response.json()["run"]["id"])


def test_it_composes_agents_whose_own_risk_settings_add_gates(
    client_for: Callable[[User], Client], alice: User
) -> None:
    careful = _start(client_for(alice), composed(risk_lookup_order="high"))
    usual = _start(client_for(alice), composed())
    assert flows.resume(careful).status == Run.Status.SUSPENDED
    assert [a.tool_call.name for a in flows.pending(careful)] == ["lookup_order"]  # a gate the file does not have
    assert flows.resume(usual).status == Run.Status.SUSPENDED
    assert [a.tool_call.name for a in flows.pending(usual)] == ["refund_request"]
    # Each run carries its agent, so any worker can drive it; the configured agents are untouched.
    assert usual.agent_config["tool_overrides"]["refund_request"] == {"risk": "high", "hitl_mode": "suspend"}
    assert careful.agent not in get_policy().agents
    assert get_policy().tool_policy("lookup_order").risk == "low"


@pytest.mark.parametrize(
    "fields",
    [
        {"risk_refund_request": "low"},
        {"risk_refund_request": ""},  # the field left out
        {"risk_refund_request": "high", "mode_refund_request": "defer"},
    ],
    ids=["low", "left-out", "defer"],
)
def test_it_keeps_agentfast_yamls_gate_on_a_composed_agent(
    client_for: Callable[[User], Client], alice: User, fields: dict[str, str]
) -> None:
    data = {key: value for key, value in composed(input="Refund order A1001 for 40.00 USD", **fields).items() if value}
    if "mode_refund_request" not in fields:
        data.pop("mode_refund_request")  # a low-risk tool's mode is not posted (the page disables it)
    run = _start(client_for(alice), data)

    run = flows.resume(run)

    assert run.status == Run.Status.SUSPENDED  # the refund waits for a person, as agentfast.yaml says
    [approval] = flows.pending(run)
    assert (approval.tool_call.name, approval.mode) == ("refund_request", "suspend")
    assert approval.tool_call.arguments == {"order_id": "A1001", "amount_cents": 4000}
    assert not SideEffect.objects.exists()


def test_it_shows_the_floor_on_the_tools_agentfast_yaml_gates(
    client_for: Callable[[User], Client], alice: User
) -> None:
    page = client_for(alice).get("/playground/").content.decode()
    refund = page[page.index('name="risk_refund_request"') : page.index('name="risk_send_email"')]
    lookup = page[page.index('name="risk_lookup_order"') : page.index('name="risk_refund_request"')]
    assert '<option value="low"  disabled>' in refund and '<option value="defer"  disabled>' in refund
    assert "agentfast.yaml requires a person's decision" in refund
    assert "disabled" not in lookup


def test_it_shows_a_composed_runs_definition_on_the_run_page(client_for: Callable[[User], Client], alice: User) -> None:
    run = _start(client_for(alice), composed(risk_refund_request="low", system_prompt="You are <b>terse</b>."))
    page = client_for(alice).get(f"/runs/{run.id}").content.decode()
    agent = page[page.index('id="run-agent"') :]
    assert "You are &lt;b&gt;terse&lt;/b&gt;." in agent and "<code>demo</code>" in agent
    assert '<code>refund_request</code> <span class="badge">high risk, suspend</span>' in agent
    assert "set by agentfast.yaml" in agent
    assert '<code>lookup_order</code> <span class="badge">low risk</span></li>' in agent
    configured = flows.start(REFUND)
    assert 'id="run-agent"' not in client_for(alice).get(f"/runs/{configured.id}").content.decode()


def test_it_names_composed_agents_after_their_settings(client_for: Callable[[User], Client], alice: User) -> None:
    first = _start(client_for(alice), composed())
    second = _start(client_for(alice), composed(input="Refund order A1002 for 15.00 USD"))
    other = _start(client_for(alice), composed(system_prompt="You are chatty."))
    assert first.agent == second.agent != other.agent
    assert first.agent.startswith("playground-")


def test_it_runs_a_composed_agent_on_an_openai_compatible_endpoint(
    client_for: Callable[[User], Client], alice: User, fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", fake_openai.base_url)
    fake_openai.script(
        lambda body: (
            Reply(content="Refunded 15.00 USD.")
            if tool_messages(body)
            else Reply(tool_calls=[("call_1", "refund_request", '{"order_id": "A1001", "amount_cents": 1500}')])
        )
    )
    run = _start(client_for(alice), composed(model="openai", model_name=MODEL, tools=["refund_request"]))
    assert flows.resume(run).status == Run.Status.SUSPENDED
    flows.decide(flows.pending(run)[0], "approved", auto_resume=False)
    assert flows.resume(run).output == "Refunded 15.00 USD."
    assert fake_openai.requests[0]["messages"][0] == {"role": "system", "content": "You are terse."}
    assert [tool["function"]["name"] for tool in fake_openai.requests[0]["tools"]] == ["refund_request"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"model": "openai", "model_name": ""}, "model_name"),
        ({"tools": ["no_such_tool"]}, "tools"),
        ({"risk_refund_request": "extreme"}, "risk_refund_request"),
    ],
)
def test_it_refuses_a_bad_composed_agent(
    client_for: Callable[[User], Client], alice: User, fields: dict[str, Any], field: str
) -> None:
    response = client_for(alice).post("/playground/runs", composed(**fields))
    assert response.status_code == 400
    assert response.json()["field"] == field
    assert not Run.objects.exists()
