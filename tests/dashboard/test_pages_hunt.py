"""Pages a hunt found wanting: text the model or an agent wrote beside the arguments, an edit to {},
a reviewer's own edit on a refusal, and pages while agentfast.yaml cannot be read."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from agents import services
from agents.gateway import services as gateway
from agents.models import Approval
from agents.runtime import drive
from tests.support.fake_openai import FakeOpenAI, Reply, tool_messages
from tests.support.flows import decide, pending, start

SPOOF = "DE99-0000\u202e6543-21ED"  # a browser shows "DE99-0000DE12-3456"
POLICY = """
agents:
  support: {tools: [lookup_order]}
tool_overrides:
  wire_money: {risk: high}
"""


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_openai: FakeOpenAI, settings: Any) -> FakeOpenAI:
    settings.OPENAI_MAX_RETRIES = 0
    config = {
        "agents": {"support": {"model": "openai:test-model", "base_url": fake_openai.base_url, "tools": ["ask_human"]}},
    }
    path = tmp_path / "agentfast.yaml"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("AGENTFAST_CONFIG", str(path))
    return fake_openai


@pytest.mark.parametrize("path", ["/?show=all", "/approvals/{id}", "/runs/{run}"])
def test_it_shows_a_question_the_model_wrote_with_its_bidirectional_override_escaped(
    client_for, alice, model: FakeOpenAI, path: str
) -> None:
    question = f"Wire the refund to {SPOOF}?"
    model.script(
        lambda body: (
            Reply(content="Done.")
            if tool_messages(body)
            else Reply(tool_calls=[("call_1", "ask_human", json.dumps({"question": question}))])
        )
    )
    run = services.run_create(agent="support", input="Where do I send the refund?", enqueue=False)
    drive(run.id, stream=False)
    approval = Approval.objects.get(run_id=run.id)
    assert approval.request["question"] == question

    page = client_for(alice).get(path.format(id=approval.id, run=run.id)).content.decode()
    assert "DE99-0000\\u202e6543-21ED" in page  # the arguments box: escaped
    raw = [line.strip()[:160] for line in page.splitlines() if "\u202e" in line]
    assert not raw, f"shown raw (a browser reads DE99-0000DE12-3456): {raw}"
    assert "\u202e" not in page, "the question line shows the override raw: it reads DE99-0000DE12-3456"


def _external(description: str) -> str:
    services.user_create(username="robot", role="agent")
    request = gateway.GateRequest(
        agent="billing",
        session="s1",
        call_id="c1",
        tool="wire_money",
        arguments={"account": "DE99-0000-1111", "cents": 2000},
        description=description,
    )
    return gateway.gate_call(owner="robot", request=request).approval_id


def test_it_shows_an_external_agents_description_on_the_approval_page_too(client_for, alice, agent_config) -> None:
    agent_config(POLICY)
    approval_id = _external("Pay invoice 7 of ACME")
    assert "Pay invoice 7 of ACME" in client_for(alice).get("/?show=all").content.decode()  # the card says it
    page = client_for(alice).get(f"/approvals/{approval_id}").content.decode()
    assert "Pay invoice 7 of ACME" in page, "Review / edit loses the agent's own words about the call"


@pytest.mark.parametrize("path", ["/?show=all"])
def test_it_shows_an_external_agents_description_with_its_bidirectional_override_escaped(
    client_for, alice, agent_config, path: str
) -> None:
    agent_config(POLICY)
    approval_id = _external(f"Pay invoice 7 to account {SPOOF}")
    page = client_for(alice).get(path.format(id=approval_id)).content.decode()
    assert "Pay invoice 7" in page
    raw = [line.strip()[:160] for line in page.splitlines() if "\u202e" in line]
    assert not raw, f"shown raw (a browser reads DE99-0000DE12-3456): {raw}"
    assert "\u202e" not in page, "the description shows the override raw: it reads DE99-0000DE12-3456"


def test_it_says_on_the_run_page_that_a_call_was_approved_with_its_arguments_edited_to_none(
    client_for, alice, agent_config
) -> None:
    agent_config(POLICY)
    services.user_create(username="robot", role="agent")
    request = gateway.GateRequest(
        agent="billing", session="s1", call_id="c1", tool="wire_money", arguments={"account": "DE99", "cents": 2000}
    )
    gated = gateway.gate_call(owner="robot", request=request)
    decide(gated.approval_id, "approved", arguments={})  # an external tool's edit may be any JSON object
    approval = Approval.objects.get(pk=gated.approval_id)
    assert approval.arguments == {} and approval.status == "approved"

    page = client_for(alice).get(f"/runs/{approval.run_id}").content.decode()
    assert "with edited arguments" in page  # the timeline's decision line
    assert "approved with edits" in page, "the run's approvals list reads as approved as proposed"
    assert "Runs with the edited arguments" in page, "the timeline does not show what runs ({})"


BROKEN = "agents: {support: {tools: [lookup_order]}}\ntool_overrides: {refund_request: {risk: extreme}}\n"


@pytest.mark.parametrize("path", ["/audit", "/policy", "/policy/refund_request"])
def test_it_renders_the_page_while_the_policy_file_cannot_be_read(client_for, carol, approval, agent_config, path):
    agent_config(BROKEN)
    client = Client(raise_request_exception=False)
    client.force_login(carol)
    assert client.get("/").status_code == 200  # the inbox lists the calls meanwhile
    response = client.get(path)
    assert response.status_code < 500, f"{path} answers {response.status_code} while the file is half saved"


def test_it_shows_the_reviewers_own_edit_back_when_the_arguments_changed_meanwhile(client_for, alice, bob):
    [approval] = pending(start("Refund order A1004 for 75.00 USD"))  # quorum 2
    seen = approval.digest
    decide(approval, "approved", by="bob", arguments={"order_id": "A1004", "amount_cents": 6000})

    mine = {"order_id": "A1004", "amount_cents": 7013}  # alice's own edit, typed while bob voted
    for headers in ({}, {"HX-Request": "true", "HX-Target": "decision"}):
        response = client_for(alice).post(
            f"/approvals/{approval.id}/decide",
            {"decision": "approved", "arguments": json.dumps(mine), "note": "fine by me", "expect_digest": seen},
            headers=headers,
        )
        page = html.unescape(response.content.decode())
        assert response.status_code == 409 and "the arguments changed since you saw them" in page
        assert ">fine by me</textarea>" in page
        assert "7013" in page, "the reviewer's edit is gone: neither in the editor nor shown to copy"
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING
