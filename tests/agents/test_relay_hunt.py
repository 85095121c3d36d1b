"""Four eyes and relayed decisions that are remembered."""

from __future__ import annotations

import json

from django.test import Client

from agents import runtime, services
from agents.models import Approval, Grant, ToolCall
from tests.support.flows import pending, start
from tests.support.policies import support_yaml

REFUND = "Refund order A1001 for 25.00 USD"


def _post(client: Client, token: str, path: str, body: dict) -> object:
    return client.post(
        path, data=json.dumps(body), content_type="application/json", headers={"Authorization": f"Bearer {token}"}
    )


def test_a_relayer_cannot_get_their_own_four_eyes_call_decided_through_a_grant_they_relayed(
    agent_config, client, alice, carol
):
    agent_config(support_yaml(four_eyes=True))
    token = services.token_create(username="carol")[1]  # carol: an admin, who may relay
    # Carol may not decide, nor relay a decision on, a run she starts: four eyes.
    mine = services.run_create(agent="support", input=REFUND, created_by="carol", enqueue=False)
    runtime.drive(mine.id, stream=False)
    [own] = pending(mine)
    refused = _post(client, token, f"/api/approvals/{own.id}/decide", {"decision": "approved", "decided_by": "alice"})
    assert refused.status_code == 403

    # On bob's run she relays alice's approval, asking to remember it for any refund of the agent.
    [other] = pending(start(REFUND))
    body = {
        "decision": "approved",
        "decided_by": "alice",
        "auto_resume": False,
        "remember": {"scope": "tool", "for_seconds": 3600},
    }
    relayed = _post(client, token, f"/api/approvals/{other.id}/decide", body)
    assert relayed.status_code == 403 and relayed.json()["field"] == "remember"
    assert not Grant.objects.exists()

    # Her next run's refund is now approved by "alice's" grant, without anyone but carol acting.
    again = services.run_create(agent="support", input=REFUND, created_by="carol", enqueue=False)
    runtime.drive(again.id, stream=False)
    decided = Approval.objects.get(run=again)
    call = ToolCall.objects.get(run=again, name="refund_request")
    assert decided.status == Approval.Status.PENDING, (
        f"carol's own four-eyes call was {decided.status} by {decided.decided_by} (call {call.status})"
    )


def test_four_eyes_hold_for_a_run_started_from_the_cli_with_the_name_typed_in_another_case(agent_config, client, alice):
    from agents import cli
    from agents.models import Run

    agent_config(support_yaml(four_eyes=True))
    assert cli.main(["runs", "start", "--agent", "support", "--inline", "--by", "Alice", REFUND]) == 0
    run = Run.objects.get()
    [approval] = pending(run)
    # The CLI refuses alice deciding it under that name (no user is named "Alice" exactly) ...
    assert cli.main(["approvals", "approve", approval.id, "--by", "Alice"]) == 1
    # ... but alice, signed in, approves the run she started: four eyes never saw her.
    token = services.token_create(username="alice")[1]
    response = _post(
        client, token, f"/api/approvals/{approval.id}/decide", {"decision": "approved", "auto_resume": False}
    )
    assert response.status_code == 403, (
        f"{response.status_code}: alice approved her own run (created_by {run.created_by!r})"
    )
