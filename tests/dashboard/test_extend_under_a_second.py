"""Extending a deadline by less than a second: the API refuses it (by_seconds >= 1); the CLI and web must too."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from agents.models import Approval, AuditEntry
from dashboard import cli
from tests.agents.test_deadlines import REFUND, deadline  # noqa: F401  (fixture)
from tests.dashboard.test_api import token_for
from tests.support.flows import start


@pytest.fixture
def pending(deadline) -> Approval:  # noqa: ANN001, F811
    deadline(timeout="1h")
    start(REFUND)
    return Approval.objects.get()


def _unchanged(approval: Approval) -> None:
    assert Approval.objects.get(pk=approval.pk).expires_at == approval.expires_at
    assert not AuditEntry.objects.filter(action="extended", outcome=AuditEntry.Outcome.DECIDED).exists()


def test_the_api_refuses_half_a_second(client: Client, pending: Approval) -> None:
    headers = {"Authorization": f"Bearer {token_for('alice')}"}
    body = json.dumps({"by_seconds": 0.5})
    response = client.post(
        f"/api/approvals/{pending.id}/extend", body, content_type="application/json", headers=headers
    )

    assert (response.status_code, response.json()["field"]) == (400, "by_seconds")
    _unchanged(pending)


@pytest.mark.parametrize("duration", ["0.5", "0.001s", "0.0000001"])
def test_the_cli_refuses_what_the_api_refuses(capsys, pending: Approval, duration: str) -> None:
    """`approvals extend --for 0.0000001` printed 'Extended …' and audited an extension of nothing."""
    code = cli.main(["approvals", "extend", pending.id, "--by", "alice", "--for", duration])

    captured = capsys.readouterr()
    assert code == 1, captured.out
    assert captured.err.startswith("agentfast: ") and captured.err.count("\n") == 1
    _unchanged(pending)


@pytest.mark.parametrize("seconds", ["0.5", "1e-300"])
def test_the_page_refuses_what_the_api_refuses(client_for, alice, pending: Approval, seconds: str) -> None:  # noqa: ANN001
    response = client_for(alice).post(
        f"/approvals/{pending.id}/extend", {"by_seconds": seconds}, headers={"HX-Request": "true"}
    )

    assert response.status_code == 422
    _unchanged(pending)
