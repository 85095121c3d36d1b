"""Tool arguments, prompts and notes are untrusted: every page shows them as text."""

from __future__ import annotations

from tests.dashboard.conftest import XSS
from tests.support.flows import decide, pending, start

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
