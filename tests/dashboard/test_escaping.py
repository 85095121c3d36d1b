"""Tool arguments, prompts and notes are untrusted: every page shows them as text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from agents import runtime, services
from agents.models import Approval
from tests.dashboard.conftest import XSS
from tests.support.fake_openai import FakeOpenAI, Reply
from tests.support.flows import EXPORT_READS_COMMITTED, decide, pending, start

PAYLOAD = "<img src=x onerror=alert(1)>"
ESCAPED = "&lt;img src=x onerror=alert(1)&gt;"


def test_it_escapes_a_hostile_email_body_on_every_page(client_for, bob, carol):
    run = start(XSS)
    [approval] = pending(run)
    client = client_for(carol)
    pages = {
        "inbox": client.get("/").content.decode(),
        "approval": client.get(f"/approvals/{approval.id}").content.decode(),
    }
    edited = {**approval.tool_call.arguments, "body": PAYLOAD + " (checked)"}
    decide(approval, "approved", by="bob", arguments=edited, note=PAYLOAD)
    pages["decided approval"] = client.get(f"/approvals/{approval.id}").content.decode()
    pages["timeline"] = client.get(f"/runs/{run.id}").content.decode()
    pages["runs"] = client.get("/runs").content.decode()
    pages["audit"] = client.get("/audit").content.decode()

    for name, html in pages.items():
        assert PAYLOAD not in html, name
        assert ESCAPED in html, name


# -- text that cannot be shown as it is (issue 7, item 2) ----------------------------------------

LONE = "\ud800"


@pytest.fixture
def surrogate_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_openai: FakeOpenAI) -> FakeOpenAI:
    """The `support` agent on the fake model server, which proposes an email full of lone surrogates."""
    config = {
        "agents": {
            "support": {
                "model": "openai:test-model",
                "base_url": fake_openai.base_url,
                "tools": ["send_email"],
                "max_steps": 5,
            }
        },
        "tool_overrides": {"send_email": {"risk": "high", "hitl_mode": "suspend"}},
    }
    path = tmp_path / "agentfast.yaml"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("AGENTFAST_CONFIG", str(path))
    monkeypatch.setenv("OPENAI_MAX_RETRIES", "0")
    # The arguments text is sent as is: it carries the JSON escape \ud800, as a model's may.
    arguments = '{"to": "bob@example.com", "subject": "Hi \\ud800", "body": "\\ud800\\udfff\\u0000 there"}'
    fake_openai.script(lambda body: Reply(content=f"Sending{LONE}", tool_calls=[("call_1", "send_email", arguments)]))
    return fake_openai


@EXPORT_READS_COMMITTED
def test_it_pauses_and_renders_every_page_when_a_model_sends_lone_surrogates(client_for, alice, carol, surrogate_model):
    run = services.run_create(agent="support", input="Email bob", enqueue=False)
    runtime.drive(run.id, stream=False)
    [approval] = Approval.objects.filter(run_id=run.id)
    assert approval.tool_call.arguments["subject"] == "Hi \ufffd"  # repaired, not lost
    refused = client_for(alice).post(
        f"/approvals/{approval.id}/decide",
        {"decision": "approved", "arguments": '{"to": "bob@example.com", "subject": "\\ud800", "body": "x"}'},
    )
    client = client_for(carol)

    pages = {
        "inbox": client.get("/"),
        "approval": client.get(f"/approvals/{approval.id}"),
        "run": client.get(f"/runs/{run.id}"),
        "runs": client.get("/runs"),
        "audit": client.get("/audit"),
        "admin": client.get(f"/admin/agents/toolcall/{approval.tool_call_id}/change/"),
    }
    export = client.get("/audit.csv")

    assert refused.status_code == 422
    assert {name: response.status_code for name, response in pages.items()} == dict.fromkeys(pages, 200)
    assert "Hi \ufffd" in pages["approval"].content.decode()
    body = async_to_sync(_read)(export)
    assert "lone surrogate" in body and "\ufffd" not in body.split("\n", 1)[0]
    approval.refresh_from_db()
    assert approval.status == "pending" and approval.arguments is None  # nothing stored from the refused edit


async def _read(response: Any) -> str:
    return b"".join([part async for part in response.streaming_content]).decode()
