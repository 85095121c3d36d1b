"""Standing decisions on the web and the API: remember from the decision form, list, revoke."""

from __future__ import annotations

import json

from django.test import Client

from agents import services
from agents.models import Approval, AuditEntry, Grant, Run
from tests.dashboard.conftest import REFUND
from tests.support.flows import decide, pending, start


def _remembered(approval: Approval, by: str = "alice") -> Grant:
    decision = decide(approval, "approved", by=by, remember=services.Remember(scope="tool", seconds=3600))
    assert decision.grant is not None
    return decision.grant


def test_it_offers_to_remember_on_the_decision_form(client_for, alice, approval):
    html = client_for(alice).get(f"/approvals/{approval.id}").content.decode()

    assert '<fieldset class="remember">' in html
    assert 'name="remember"' in html and '<option value="28800">for 8 h</option>' in html
    assert '<option value="tool">for any arguments of this tool from this agent</option>' in html
    assert 'href="/grants"' in html  # the nav link


def test_it_remembers_a_web_decision_and_the_next_identical_call_runs(client_for, alice, approval):
    response = client_for(alice).post(
        f"/approvals/{approval.id}/decide", {"decision": "approved", "remember": "3600", "remember_scope": "exact"}
    )

    assert response.status_code == 302
    grant = Grant.objects.get()
    assert (grant.created_by, grant.scope, grant.approval_id) == ("alice", "exact", approval.id)
    assert AuditEntry.objects.filter(approval_id=approval.id, action="remembered", source="web").exists()
    run = start(REFUND)
    assert run.status == Run.Status.COMPLETED and pending(run) == []


def test_it_refuses_a_web_decision_that_cannot_be_remembered_and_decides_nothing(client_for, alice):
    [approval] = pending(start("Refund order A1004 for 75.00 USD"))  # quorum 2

    response = client_for(alice).post(f"/approvals/{approval.id}/decide", {"decision": "approved", "remember": "3600"})

    assert response.status_code == 403
    assert "cannot be remembered" in response.content.decode()
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING and not Grant.objects.exists()


def test_it_lists_standing_decisions_with_a_revoke_button_for_their_own(client_for, alice, bob, carol, approval):
    grant = _remembered(approval, by="alice")

    mine = client_for(alice).get("/grants").content.decode()
    others = client_for(bob).get("/grants").content.decode()
    admins = client_for(carol).get("/grants").content.decode()

    assert f'id="grant-{grant.id}"' in mine and "refund_request" in mine and "0 times" in mine
    assert f"/grants/{grant.id}/revoke" in mine and f"/grants/{grant.id}/revoke" in admins
    assert f'id="grant-{grant.id}"' in others and f"/grants/{grant.id}/revoke" not in others


def test_it_revokes_by_post_only_for_the_creator_or_an_admin(client_for, alice, bob, carol, approval):
    grant = _remembered(approval, by="alice")

    assert client_for(alice).get(f"/grants/{grant.id}/revoke").status_code == 405
    assert client_for(bob).post(f"/grants/{grant.id}/revoke").status_code == 403
    assert client_for(carol).post(f"/grants/{grant.id}/revoke").status_code == 302

    grant.refresh_from_db()
    assert grant.revoked_by == "carol"
    assert f'id="grant-{grant.id}"' not in client_for(alice).get("/grants").content.decode()


def test_it_needs_csrf_to_revoke(alice, approval):
    grant = _remembered(approval)
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)

    assert client.post(f"/grants/{grant.id}/revoke").status_code == 403
    grant.refresh_from_db()
    assert grant.revoked_at is None


def test_it_keeps_the_page_from_anonymous_users_and_non_reviewers(client, client_for, dave):
    assert client.get("/grants").status_code == 302
    assert client_for(dave).get("/grants").status_code == 403


def test_it_remembers_through_the_api_and_bounds_the_duration(client, alice, approval):
    token = services.token_create(username="alice")[1]
    headers = {"Authorization": f"Bearer {token}"}
    url = f"/api/approvals/{approval.id}/decide"

    def post(body: dict[str, object]) -> object:
        return client.post(url, data=json.dumps(body), content_type="application/json", headers=headers)

    too_long = post({"decision": "approved", "remember": {"scope": "tool", "for_seconds": 8 * 86400}})
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING  # refused whole: nothing decided
    response = post({"decision": "approved", "remember": {"scope": "tool", "for_seconds": 3600}})

    assert too_long.status_code == 400 and "for_seconds" in too_long.content.decode()
    assert response.status_code == 200
    grant = Grant.objects.get()
    assert response.json()["grant_id"] == grant.id and grant.scope == "tool"


def test_it_names_the_account_whose_calls_an_external_grant_decides(agent_config, client_for, alice, capsys):
    from agents.cli import main as cli_main
    from agents.gateway import services as gateway

    agent_config("tool_overrides:\n  wire_money: {risk: high}\n")
    services.user_create(username="robot", role="agent")
    request = gateway.GateRequest(
        agent="billing", session="s1", call_id="c1", tool="wire_money", arguments={"cents": 1}
    )
    answer = gateway.gate_call(owner="robot", request=request)
    _remembered(Approval.objects.get(pk=answer.approval_id), by="alice")

    page = client_for(alice).get("/grants").content.decode()
    assert cli_main(["grants", "list", "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)

    assert "<td>billing of account robot</td>" in page
    assert (listed["agent"], listed["kind"], listed["account"]) == ("billing", "external", "robot")
